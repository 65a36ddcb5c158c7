#include "megaton/nn/mlp.h"

#include <optional>

#include "megaton/kernels/activation.h"
#include "megaton/kernels/fp8_sources.h"

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
      swiglu_(activation == Activation::SwiGLU),
      fc1_bias_(bias) {
  set_bias_activation_fusion(FusionConfig{}.bias_activation);
}

void Mlp::set_bias_activation_fusion(bool on) {
  fuse_bias_ = on && fc1_bias_;
  fc1.defer_bias(fuse_bias_);
}

namespace {
// The bias as the fused kernels read it: in the activations' compute dtype (a bf16 bias of
// inference weights is widened; a training bias is its f32 main value already).
Tensor bias_for(const Parameter& bias, const Tensor& h) {
  return as_dtype(bias.value, h.dtype() == DType::F64 ? DType::F64 : DType::F32);
}

// LayerNormMLP's fc1 epilogue: fc2's FP8 input quantised from each stripe of fc1's output as the
// GEMM finishes it, the activation (+ fc1's deferred bias) computed in f32 as the quantiser reads
// it (kernels::activation_fp8_source). The activation's output is never written, and h is read
// back from cache instead of memory (per-tensor current scaling still reads it once more: its scale
// needs the whole amax first).
class ActivationCast final : public OutputEpilogue {
 public:
  ActivationCast(fp8::LinearQuantizer& fc2, const Parameter* bias, bool swiglu, std::string name)
      : fc2_(fc2), bias_(bias), swiglu_(swiglu), name_(std::move(name)) {}
  void begin(const Tensor& h) override {
    const Tensor bias = bias_ ? bias_for(*bias_, h) : Tensor();
    stripes_.emplace(fc2_.input_stripes(kernels::activation_fp8_source(h, bias, swiglu_, name_)));
  }
  void rows(int64_t r0, int64_t r1) override { stripes_->rows(r0, r1); }
  fp8::LinearQuantizer::Input finish() { return fc2_.finish_input(*stripes_); }

 private:
  fp8::LinearQuantizer& fc2_;
  const Parameter* bias_;
  bool swiglu_;
  std::string name_;
  std::optional<kernels::Fp8StripeQuantizer> stripes_;
};
}  // namespace

Tensor Mlp::forward(SublayerCtx& c, const Tensor& x, int64_t B, int64_t T) {
  FusedInput in = FusedInput::of(x);
  return forward_fused(c, in, B, T);
}

Tensor Mlp::forward_fused(SublayerCtx& c, FusedInput& x, int64_t, int64_t) {
  auto& ctx = ctx_as<MlpCtx>(c);
  const std::string name = fc1.weight.name + ".act";
  if (fuse_act_cast_ && fc1.forward_in_fp8() && fc2.forward_in_fp8()) {
    ActivationCast cast(*fc2.fp8(), fuse_bias_ ? &fc1.bias : nullptr, swiglu_, name);
    ctx.h = fc1.forward(ctx.fc1_ctx, x, &cast);
    return fc2.forward(ctx.fc2_ctx, cast.finish(), ctx.h.dtype());
  }
  ctx.h = fc1.forward(ctx.fc1_ctx, x);
  const Tensor& h = ctx.h;
  Tensor a = new_activation({rows_of(h), ffn_}, name, h.dtype());  // every row of the micro-batch under SP
  const auto on = kernels::ExecContext::on(h);
  if (fuse_bias_) {
    const Tensor bias = bias_for(fc1.bias, h);
    swiglu_ ? kernels::bias_swiglu_forward(on, a, h, bias) : kernels::bias_gelu_forward(on, a, h, bias);
  } else {
    swiglu_ ? kernels::swiglu_forward(on, a, h) : kernels::gelu_forward(on, a, h);
  }
  return fc2.forward(ctx.fc2_ctx, a);
}

Tensor Mlp::backward_input(SublayerCtx& c, const Tensor& dy, int64_t, int64_t) {
  auto& ctx = ctx_as<MlpCtx>(c);
  Tensor da = fc2.backward_input(ctx.fc2_ctx, dy);
  Tensor dh = new_activation(ctx.h.shape(), fc1.weight.name + ".dact", da.dtype());
  const auto on = kernels::ExecContext::on(dy);
  if (fuse_bias_) {  // fc1's bias gradient is summed here, in B, instead of in fc1's W
    const Tensor bias = bias_for(fc1.bias, ctx.h);
    swiglu_ ? kernels::bias_swiglu_backward(on, dh, fc1.bias.grad, da, ctx.h, bias)
            : kernels::bias_gelu_backward(on, dh, fc1.bias.grad, da, ctx.h, bias);
  } else {
    swiglu_ ? kernels::swiglu_backward(on, dh, da, ctx.h) : kernels::gelu_backward(on, dh, da, ctx.h);
  }
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
