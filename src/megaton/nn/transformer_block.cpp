#include "megaton/nn/transformer_block.h"

#include "megaton/kernels/activation.h"

namespace megaton::nn {

TransformerBlock::TransformerBlock(const std::string& name, const BlockSpec& s, const RopeTables* rope)
    : spec(s),
      input_norm(name + ".input_layernorm", s.attn.hidden, s.norm, s.norm_eps, s.tp.splits_sequence()),
      attention(make_attention(name + ".self_attention", s, rope)),
      pre_mlp_norm(name + ".pre_mlp_layernorm", s.attn.hidden, s.norm, s.norm_eps, s.tp.splits_sequence()),
      mlp(make_mlp(name + ".mlp", s)),
      name_(name) {}

namespace {
// a += b, returning a. `a` is always a fresh branch output (or input gradient) that no context
// keeps, so the residual sum reuses its storage instead of allocating another tensor.
Tensor add_into(Tensor a, const Tensor& b) {
  kernels::residual_forward(kernels::ExecContext::on(a), a, a, b);
  return a;
}

SublayerCtx& existing(const std::unique_ptr<SublayerCtx>& ctx, const char* op) {
  MEGATON_CHECK(ctx != nullptr, op, " on a block context without a forward");
  return *ctx;
}
}  // namespace

Tensor TransformerBlock::forward(BlockCtx& ctx, const Tensor& x, int64_t B, int64_t T) {
  ctx.attn = attention->new_ctx();
  ctx.mlp = mlp->new_ctx();
  Tensor h = add_into(attention->forward(*ctx.attn, input_norm.forward(ctx.norm1, x), B, T), x);
  const Tensor n2 = pre_mlp_norm.forward(ctx.norm2, h);
  Tensor m = mlp->forward(*ctx.mlp, n2, B, T);
  if (recompute_mlp_) {  // rebuilt by backward_input from its input
    ctx.mlp_input = n2;
    ctx.mlp.reset();
  }
  return add_into(m, h);
}

Tensor TransformerBlock::backward_input(BlockCtx& ctx, const Tensor& dy, int64_t B, int64_t T) {
  if (ctx.mlp_input.defined()) {
    ctx.mlp = mlp->new_ctx();
    (void)mlp->forward(*ctx.mlp, ctx.mlp_input, B, T);
    ctx.mlp_input = {};
  }
  // dy flows into both the residual and the MLP branch; dh = dy + dMLP/dh.
  Tensor dh = pre_mlp_norm.backward_input(ctx.norm2, mlp->backward_input(existing(ctx.mlp, "backward_input"), dy, B, T));
  add_into(dh, dy);
  Tensor dx = input_norm.backward_input(ctx.norm1,
                                        attention->backward_input(existing(ctx.attn, "backward_input"), dh, B, T));
  return add_into(dx, dh);
}

void TransformerBlock::backward_weight(BlockCtx& ctx) {
  mlp->backward_weight(existing(ctx.mlp, "backward_weight"));
  pre_mlp_norm.backward_weight(ctx.norm2);
  attention->backward_weight(existing(ctx.attn, "backward_weight"));
  input_norm.backward_weight(ctx.norm1);
  ctx.attn.reset();
  ctx.mlp.reset();
}

Tensor TransformerBlock::forward_cached(KVCache& cache, const Tensor& x, int64_t B, int64_t T) {
  NormCtx n1, n2;
  auto m = mlp->new_ctx();
  Tensor h = add_into(attention->forward_cached(cache, input_norm.forward(n1, x), B, T), x);
  return add_into(mlp->forward(*m, pre_mlp_norm.forward(n2, h), B, T), h);
}

void TransformerBlock::set_recompute(const RecomputeConfig& config) {
  const bool selective = config.granularity == RecomputeGranularity::Selective;
  recompute_mlp_ = selective && config.mlp;
  attention->set_recompute_core(selective && config.core_attn);
}

void TransformerBlock::parameters(ParameterList& out) {
  input_norm.parameters(out);
  attention->parameters(out);
  pre_mlp_norm.parameters(out);
  mlp->parameters(out);
}

void TransformerBlock::linears(std::vector<Linear*>& out) {
  attention->linears(out);
  mlp->linears(out);
}

void TransformerBlock::gemm_weights(ParameterList& out) {
  attention->gemm_weights(out);
  mlp->gemm_weights(out);
}

SelfAttention& TransformerBlock::self_attention() {
  auto* a = dynamic_cast<SelfAttention*>(attention.get());
  if (!a) fail("layer ", name_, " has attention kind '", spec.attention, "', not self_attention");
  return *a;
}

Mlp& TransformerBlock::dense_mlp() {
  auto* m = dynamic_cast<Mlp*>(mlp.get());
  if (!m) fail("layer ", name_, " has mlp kind '", spec.mlp, "', not dense");
  return *m;
}

}  // namespace megaton::nn
