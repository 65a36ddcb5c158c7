#include "megaton/nn/mlp.h"

#include "megaton/kernels/activation.h"

namespace megaton::nn {

Mlp::Mlp(const std::string& name, int64_t hidden, int64_t ffn_hidden, Activation activation, bool bias,
         const TensorParallel& tp)
    : fc1(name + ".linear_fc1", hidden, activation == Activation::SwiGLU ? 2 * ffn_hidden : ffn_hidden, bias,
          LinearParallel::Column, tp,
          even_pieces(activation == Activation::SwiGLU ? std::vector<int64_t>{ffn_hidden, ffn_hidden}
                                                       : std::vector<int64_t>{ffn_hidden},
                      tp.size(), "ffn_hidden_size")),
      fc2(name + ".linear_fc2", ffn_hidden, hidden, bias, LinearParallel::Row, tp),
      ffn_(fc2.in_features()),
      swiglu_(activation == Activation::SwiGLU) {}

Tensor Mlp::forward(SublayerCtx& c, const Tensor& x, int64_t, int64_t) {
  auto& ctx = ctx_as<MlpCtx>(c);
  ctx.h = fc1.forward(ctx.fc1_ctx, x);
  const int64_t N = rows_of(ctx.h);  // every row of the micro-batch under sequence parallelism
  Tensor a = new_activation({N, ffn_}, fc1.weight.name + ".act", ctx.h.dtype());
  if (swiglu_)
    kernels::swiglu_forward(kernels::ExecContext::on(x), a, ctx.h);
  else
    kernels::gelu_forward(kernels::ExecContext::on(x), a, ctx.h);
  return fc2.forward(ctx.fc2_ctx, a);
}

Tensor Mlp::backward_input(SublayerCtx& c, const Tensor& dy, int64_t, int64_t) {
  auto& ctx = ctx_as<MlpCtx>(c);
  Tensor da = fc2.backward_input(ctx.fc2_ctx, dy);
  Tensor dh = new_activation(ctx.h.shape(), fc1.weight.name + ".dact", da.dtype());
  if (swiglu_)
    kernels::swiglu_backward(kernels::ExecContext::on(dy), dh, da, ctx.h);
  else
    kernels::gelu_backward(kernels::ExecContext::on(dy), dh, da, ctx.h);
  ctx.h = {};
  return fc1.backward_input(ctx.fc1_ctx, dh);
}

void Mlp::backward_weight(SublayerCtx& c) {
  auto& ctx = ctx_as<MlpCtx>(c);
  fc2.backward_weight(ctx.fc2_ctx);
  fc1.backward_weight(ctx.fc1_ctx);
}

void Mlp::parameters(ParameterList& out) {
  fc1.parameters(out);
  fc2.parameters(out);
}

void Mlp::gemm_weights(ParameterList& out) { out.insert(out.end(), {&fc1.weight, &fc2.weight}); }

}  // namespace megaton::nn
