// Pre-norm decoder block: x + attention(norm1(x)), then + mlp(norm2(.)), with the attention and
// MLP kinds and the norm named by a BlockSpec (block_spec.h). Under sequence parallelism the block's
// input and output, the norms and the residual sums hold this rank's rows of the micro-batch; the
// sublayers gather and scatter them around their parallel linears.
#pragma once
#include "megaton/nn/block_spec.h"
#include "megaton/nn/fusion.h"
#include "megaton/nn/mla_attention.h"
#include "megaton/nn/mlp.h"
#include "megaton/nn/norm.h"
#include "megaton/nn/recompute.h"

namespace megaton::nn {

// One micro-batch's activations of one block; the sublayer contexts are created on the first
// forward by the sublayers themselves (their type depends on the kind).
struct BlockCtx {
  NormCtx norm1, norm2;
  std::unique_ptr<SublayerCtx> attn, mlp;
  Tensor mlp_input;  // selective recompute of the MLP: its input, kept instead of its context
  // Selective recompute of the norms: the sublayer's kept input was the norm's output and was
  // dropped; B rebuilds it from the norm's saved input.
  bool norm1_out_dropped = false, norm2_out_dropped = false;
};

class TransformerBlock {
 public:
  TransformerBlock(const std::string& name, const BlockSpec& spec, const RopeTables* rope);
  Tensor forward(BlockCtx& ctx, const Tensor& x, int64_t B, int64_t T);
  Tensor backward_input(BlockCtx& ctx, const Tensor& dy, int64_t B, int64_t T);
  void backward_weight(BlockCtx& ctx);
  Tensor forward_cached(KVCache& cache, const Tensor& x, int64_t B, int64_t T);
  Tensor forward_paged(PagedKVCache::Layer& layer, const PagedBatch& batch, const Tensor& x);
  // Selective recompute of this block's modules (core_attn, mlp); other granularities leave the
  // block as it is (full recompute is the model chunk's).
  void set_recompute(const RecomputeConfig& config);
  // The fused kernels this block runs (fusion.h; FusionConfig's defaults from construction).
  void set_fusion(const FusionConfig& config);
  void parameters(ParameterList& out);
  void gemm_weights(ParameterList& out);
  void linears(std::vector<Linear*>& out);

  // The sublayers as their concrete kind, for code that knows the layout of one kind (the HF
  // import/export of GPT-2 and Llama); throws naming the layer and its kind when it is another.
  SelfAttention& self_attention();
  MultiLatentAttention& latent_attention();
  Mlp& dense_mlp();

  const BlockSpec spec;
  Norm input_norm;
  std::unique_ptr<AttentionLayer> attention;
  Norm pre_mlp_norm;
  std::unique_ptr<MlpLayer> mlp;

 private:
  // h += x, then norm(h): one pass under residual_norm fusion. As a fused input (Norm::fused_input).
  FusedInput add_then_norm(Norm& norm, NormCtx& ctx, const Tensor& h, const Tensor& x) const;
  // The sublayer's forward on a norm's output: handed over unwritten under layernorm_linear fusion.
  Tensor forward_normed(Sublayer& sublayer, SublayerCtx& ctx, FusedInput& normed, int64_t B, int64_t T) const;
  // The norm's input gradient + the residual stream's gradient dresidual (fused under residual_norm).
  Tensor norm_backward_add(Norm& norm, NormCtx& ctx, const Tensor& dnorm, const Tensor& dresidual) const;

  std::string name_;
  bool recompute_mlp_ = false, recompute_norm_ = false;
  bool fuse_residual_norm_ = FusionConfig{}.residual_norm;
  bool fuse_norm_linear_ = FusionConfig{}.layernorm_linear;
};

}  // namespace megaton::nn
