// Causal self-attention: fused QKV projection, optional RoPE, flash-style attention, output
// projection. The fused QKV rows (of linear_qkv's weight and bias, and the columns of the qkv
// activation) are Megatron-Core's per-query-group layout: for each kv group g, [the heads / groups
// q heads of g | k_g | v_g], head_dim rows each, so that a tensor-parallel rank's share, a range of
// groups, is one contiguous block. The HF interop converts to and from q_proj / k_proj / v_proj.
#pragma once
#include "megaton/kernels/rope.h"
#include "megaton/nn/linear.h"
#include "megaton/nn/sublayer.h"

namespace megaton::nn {

// cos/sin tables [max_positions, head_dim / 2], built once per model.
struct RopeTables {
  Tensor cos, sin;
  kernels::RopeLayout layout = kernels::RopeLayout::Half;
};

struct AttentionShape {
  int64_t hidden, heads, groups, head_dim;
  int64_t q_size() const { return heads * head_dim; }
  int64_t kv_size() const { return groups * head_dim; }
  int64_t qkv_size() const { return q_size() + 2 * kv_size(); }
  // One group's block of fused QKV rows, and where its k and v heads start inside it.
  int64_t group_size() const { return (heads / groups + 2) * head_dim; }
  int64_t k_offset() const { return heads / groups * head_dim; }
  int64_t v_offset() const { return k_offset() + head_dim; }
  // The fused QKV row that holds row r of [all q heads | all k heads | all v heads] (HF's q_proj,
  // k_proj and v_proj stacked, or GPT-2's c_attn outputs).
  int64_t fused_row(int64_t r) const;
};

// This rank's share of `global` over tp ranks (heads / tp query heads; groups / tp kv groups, or
// one replicated group), and the fused QKV rows it holds, per rank; throws naming the sizes when
// the heads do not split.
AttentionShape local_attention_shape(const AttentionShape& global, int tp);
std::vector<std::vector<ShardPiece>> qkv_pieces(const AttentionShape& global, int tp);

// The output projection of an attention core's output `out` (kept in the caller's context). Under
// selective recompute of core_attn, out and its softmax statistics lse are dropped afterwards, and
// with them the projection's kept input: backward_input rebuilds all three.
Tensor project_attention_output(Linear& proj, LinearCtx& proj_ctx, Tensor& out, Tensor& lse, bool recompute_core);

struct AttentionCtx : SublayerCtx {
  LinearCtx qkv_ctx;
  // The kernels' own buffers when attention runs in the activations' dtype (f32, or bf16 where
  // kernels::attention_dtype keeps it): qkv with q and k already rotated, and the attention output.
  // bf16 attending in f32 keeps the layer's bf16 tensors instead (qkv as the linear produced it, not
  // yet rotated; the output as the projection reads it), half the bytes; backward converts and
  // rotates again.
  Tensor qkv;  // [N, qkv_size]
  Tensor out;  // [N, heads * head_dim] attention output before the projection
  Tensor lse;  // [B, heads, T]
  LinearCtx proj_ctx;
};

// The "self_attention" kind of block_spec.h.
class SelfAttention final : public AttentionLayer {
 public:
  // shape: the global one; tp: the group its heads are split over.
  SelfAttention(const std::string& name, AttentionShape shape, bool bias, const RopeTables* rope,
                const TensorParallel& tp = {});
  std::unique_ptr<SublayerCtx> new_ctx() const override { return std::make_unique<AttentionCtx>(); }
  Tensor forward(SublayerCtx& ctx, const Tensor& x, int64_t B, int64_t T) override;
  Tensor forward_fused(SublayerCtx& ctx, FusedInput& x, int64_t B, int64_t T) override;
  Tensor backward_input(SublayerCtx& ctx, const Tensor& dy, int64_t B, int64_t T) override;
  void backward_weight(SublayerCtx& ctx) override;
  Tensor forward_cached(KVCache& cache, const Tensor& x, int64_t B, int64_t T) override;
  bool paged() const override { return true; }
  PagedLayerSpec paged_layer() const override { return {shape_.kv_size(), shape_.head_dim}; }
  Tensor forward_paged(PagedKVCache::Layer& layer, const PagedBatch& batch, const Tensor& x) override;
  // bf16 keys and values for a bf16 model (half the bytes each decode step reads), else f32.
  KVCache new_cache(int64_t B, int64_t max_len, DType dtype) const override;
  void set_recompute_core(bool on) override { recompute_core_ = on; }
  Tensor* kept_input(SublayerCtx& ctx) override { return &ctx_as<AttentionCtx>(ctx).qkv_ctx.x; }
  void parameters(ParameterList& out) override;
  void gemm_weights(ParameterList& out) override;
  void linears(std::vector<Linear*>& out) override { out.insert(out.end(), {&qkv, &proj}); }

  Linear qkv;
  Linear proj;

 private:
  void rotate(Tensor& qkv_buf, int64_t B, int64_t T, int64_t pos_offset, bool inverse) const;
  // qkv in the attention's dtype (kernels::attention_dtype) with q and k rotated: qkv_x itself,
  // rotated in place and returned, when it has that dtype; else an f32 copy, rotated there.
  Tensor rotated(const Tensor& qkv_x, int64_t B, int64_t T) const;
  kernels::HeadStrides fused_strides() const;  // q, k and v heads in the fused QKV rows
  // The core: attention of the rotated qkv into a new output of its dtype, the statistics into ctx.lse.
  Tensor core_forward(AttentionCtx& ctx, const Tensor& qkv_rotated, int64_t B, int64_t T) const;
  AttentionShape shape_;  // this rank's heads and groups
  const RopeTables* rope_;
  double scale_;
  bool recompute_core_ = false;
};

}  // namespace megaton::nn
