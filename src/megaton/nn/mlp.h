// Feed-forward block, the "dense" MLP kind of block_spec.h: linear_fc1 -> GeLU or SwiGLU ->
// linear_fc2. For SwiGLU, fc1 produces [gate | up] (2 x ffn_hidden outputs) in one GEMM, as
// Megatron's gated linear units do. Over a tensor-parallel group fc1 is column-parallel (with
// SwiGLU each rank holds its share of gate and of up, so its activation is local) and fc2
// row-parallel.
#pragma once
#include "megaton/nn/fusion.h"
#include "megaton/nn/layer_kinds.h"
#include "megaton/nn/linear.h"
#include "megaton/nn/sublayer.h"

namespace megaton::nn {

struct MlpCtx : SublayerCtx {
  LinearCtx fc1_ctx;
  Tensor h;  // fc1 output (activation input)
  LinearCtx fc2_ctx;
};

class Mlp final : public MlpLayer {
 public:
  Mlp(const std::string& name, int64_t hidden, int64_t ffn_hidden, Activation activation, bool bias,
      const TensorParallel& tp = {});
  std::unique_ptr<SublayerCtx> new_ctx() const override { return std::make_unique<MlpCtx>(); }
  // Rows are independent tokens: B and T are not used.
  Tensor forward(SublayerCtx& ctx, const Tensor& x, int64_t B, int64_t T) override;
  // LayerNormMLP when x is a norm's fused input and fc1 / fc2 run in FP8 (with the activation's
  // fusion on, fc2's 8-bit input is made in fc1's GEMM epilogue: set_activation_cast_fusion).
  Tensor forward_fused(SublayerCtx& ctx, FusedInput& x, int64_t B, int64_t T) override;
  Tensor backward_input(SublayerCtx& ctx, const Tensor& dy, int64_t B, int64_t T) override;
  void backward_weight(SublayerCtx& ctx) override;
  void parameters(ParameterList& out) override;
  void gemm_weights(ParameterList& out) override;
  void linears(std::vector<Linear*>& out) override { out.insert(out.end(), {&fc1, &fc2}); }
  Tensor* kept_input(SublayerCtx& ctx) override { return &ctx_as<MlpCtx>(ctx).fc1_ctx.x; }
  // FusionConfig::bias_activation (on from construction); changes nothing when fc1 has no bias.
  void set_bias_activation_fusion(bool on);
  // FusionConfig::layernorm_mlp: under FP8 the activation is computed as fc2's quantiser reads it
  // (kernels::activation_fp8_source), stripe by stripe in fc1's GEMM epilogue, instead of being
  // written in the compute dtype first.
  void set_activation_cast_fusion(bool on) { fuse_act_cast_ = on; }

  Linear fc1;
  Linear fc2;

 private:
  int64_t ffn_;  // this rank's share of ffn_hidden
  bool swiglu_;
  bool fc1_bias_;
  bool fuse_bias_ = false;  // fc1's bias added by the activation (ctx.h then holds x W^T alone)
  bool fuse_act_cast_ = FusionConfig{}.layernorm_mlp;
};

}  // namespace megaton::nn
