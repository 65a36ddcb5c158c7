// LayerNorm or RMSNorm over the hidden dimension, chosen by the model config.
#pragma once
#include "megaton/nn/fused_input.h"
#include "megaton/nn/layer_kinds.h"
#include "megaton/nn/parameter.h"

namespace megaton::nn {

struct NormCtx {
  Tensor x;     // input
  Tensor mean;  // [N] (LayerNorm only)
  Tensor rstd;  // [N]
  Tensor dy;    // saved by backward_input for backward_weight
};

class Norm {
 public:
  // partial_grad: the norm sees only this rank's rows (sequence parallelism), so its weight
  // gradients are parts, summed over the tensor-parallel group after backward.
  Norm(const std::string& name, int64_t hidden, Normalization kind, double eps, bool partial_grad = false);
  Tensor forward(NormCtx& ctx, const Tensor& x);
  // The residual add before the norm fused into it (FusionConfig::residual_norm): x += residual
  // in x's storage (so x must be a fresh tensor no other context keeps), then the norm of the sum,
  // in one pass over each row; returns the norm's output.
  Tensor forward_add(NormCtx& ctx, const Tensor& x, const Tensor& residual);
  // forward (or forward_add, when residual is defined) as an input its linear may quantise straight
  // to FP8 (LayerNormLinear / RMSNormLinear): produced, only the statistics are written, and the
  // output is made in f32 block by block as the quantiser reads it. ctx afterwards holds what
  // backward needs either way.
  FusedInput fused_input(NormCtx& ctx, const Tensor& x, const Tensor& residual = {});
  // dresidual, when defined, is added into the returned input gradient as it is written: the
  // gradient of a residual stream that feeds both this norm and the residual branch.
  Tensor backward_input(NormCtx& ctx, const Tensor& dy, const Tensor& dresidual = {});
  void backward_weight(NormCtx& ctx);
  void parameters(ParameterList& out);

  Parameter weight;
  Parameter bias;  // LayerNorm only

 private:
  Tensor normalize(NormCtx& ctx, const Tensor& x, const Tensor& residual);

  int64_t hidden_;
  bool rms_;
  double eps_;
};

}  // namespace megaton::nn
