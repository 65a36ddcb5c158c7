#include "megaton/nn/transformer_block.h"

#include "megaton/kernels/activation.h"

namespace megaton::nn {

TransformerBlock::TransformerBlock(const std::string& name, const BlockSpec& s, const RopeTables* rope)
    : input_norm(name + ".input_layernorm", s.attn.hidden, s.rms_norm, s.norm_eps),
      attention(name + ".self_attention", s.attn, s.bias, rope),
      pre_mlp_norm(name + ".pre_mlp_layernorm", s.attn.hidden, s.rms_norm, s.norm_eps),
      mlp(name + ".mlp", s.attn.hidden, s.ffn_hidden, s.swiglu, s.bias) {}

namespace {
// a += b, returning a. `a` is always a fresh branch output (or input gradient) that no context
// keeps, so the residual sum reuses its storage instead of allocating another tensor.
Tensor add_into(Tensor a, const Tensor& b) {
  kernels::residual_forward(kernels::ExecContext::on(a), a, a, b);
  return a;
}
}  // namespace

Tensor TransformerBlock::forward(BlockCtx& ctx, const Tensor& x, int64_t B, int64_t T) {
  Tensor h = add_into(attention.forward(ctx.attn, input_norm.forward(ctx.norm1, x), B, T), x);
  Tensor m = mlp.forward(ctx.mlp, pre_mlp_norm.forward(ctx.norm2, h));
  return add_into(m, h);
}

Tensor TransformerBlock::backward_input(BlockCtx& ctx, const Tensor& dy, int64_t B, int64_t T) {
  // dy flows into both the residual and the MLP branch; dh = dy + dMLP/dh.
  Tensor dh = pre_mlp_norm.backward_input(ctx.norm2, mlp.backward_input(ctx.mlp, dy));
  add_into(dh, dy);
  Tensor dx = input_norm.backward_input(ctx.norm1, attention.backward_input(ctx.attn, dh, B, T));
  return add_into(dx, dh);
}

void TransformerBlock::backward_weight(BlockCtx& ctx) {
  mlp.backward_weight(ctx.mlp);
  pre_mlp_norm.backward_weight(ctx.norm2);
  attention.backward_weight(ctx.attn);
  input_norm.backward_weight(ctx.norm1);
}

Tensor TransformerBlock::forward_cached(KVCache& cache, const Tensor& x, int64_t B, int64_t T) {
  NormCtx n1, n2;
  MlpCtx m;
  Tensor h = add_into(attention.forward_cached(cache, input_norm.forward(n1, x), B, T), x);
  return add_into(mlp.forward(m, pre_mlp_norm.forward(n2, h)), h);
}

void TransformerBlock::parameters(ParameterList& out) {
  input_norm.parameters(out);
  attention.parameters(out);
  pre_mlp_norm.parameters(out);
  mlp.parameters(out);
}

}  // namespace megaton::nn
