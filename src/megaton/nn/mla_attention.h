// Multi-latent attention (DeepSeek-V2 / V3; Megatron-Core's MLASelfAttention), the "mla" kind of
// block_spec.h. Per token x:
//   queries:  q = W_q_up RMSNorm(W_q_down x)   (or q = W_q x when q_lora_rank is 0), per head
//             [q_nope (qk_head_dim) | q_rope (qk_pos_emb_head_dim)], q_rope rotated;
//   latent:   [c | k_rope] = W_kv_down x, with c of kv_lora_rank and one rotary key k_rope shared by
//             every head; kv = W_kv_up RMSNorm(c), per head [k_nope | v];
//   keys:     per head [k_nope | rotated k_rope];  values v (v_head_dim);
//   out:      W_proj softmax(scale q k^T + causal) v.
// RoPE and the attention run in f32 (as SelfAttention); the activations a bf16 run keeps for
// backward are f32 here. Decoding caches the latent only: each token's normalised c and rotated
// k_rope (kv_lora_rank + qk_pos_emb_head_dim values instead of heads x (k + v)), and attends in the
// absorbed form, W_uk folded into the query and W_uv into the output projection (absorbed()), a
// multi-query attention over the latent with keys [c | k_rope] and values c, equal to the naive
// form above up to rounding.
// Tensor parallelism (Megatron's MLA under tp): the up-projections are column-parallel and the output
// projection row-parallel over the heads; the down-projections and latent norms are replicated,
// every rank computing the whole latent (the up-projections' backward all-reduces its gradient;
// the shared rope key's gradient, a sum over this rank's heads, is all-reduced too). Under sequence
// parallelism the latents are computed for this rank's rows (their weight gradients are parts,
// summed over the group), the up-projections gather the rows and the rope keys are gathered with the
// latent; their gradients are reduce-scattered back to the rows.
#pragma once
#include <numeric>

#include "megaton/nn/attention.h"
#include "megaton/nn/mla_config.h"
#include "megaton/nn/norm.h"

namespace megaton::nn {

struct MlaCtx : SublayerCtx {
  LinearCtx q_down_ctx, q_up_ctx, kv_down_ctx, kv_up_ctx, proj_ctx;
  NormCtx q_norm_ctx, kv_norm_ctx;
  Tensor q;    // [N, heads * qk_dim] f32, q_rope rotated
  Tensor kv;   // [N, heads * (qk_dim + v_head_dim)] f32: per head [k_nope | rotated k_rope | v]
  Tensor out;  // [N, heads * v_head_dim] attention output as the projection read it
  Tensor lse;  // [B, heads, T]
};

// The absorbed decoding weights (made by absorbed() from the current weights): per head h,
// query rows [W_uk_h^T W_q_nope_h ; W_q_rope_h] over the query latent (or x), and the output
// projection's columns W_proj_h W_uv_h over the attention's latent output.
struct MlaAbsorbed {
  Tensor q_weight;     // [heads * (kv_lora_rank + rope), q_lora_rank or hidden]
  Tensor proj_weight;  // [hidden, heads * kv_lora_rank]
};

class MultiLatentAttention final : public AttentionLayer {
 public:
  // rope: tables of qk_pos_emb_head_dim; softmax_scale: 1 / sqrt(qk_dim) times YaRN's factor; heads:
  // the global count, split over tp.
  MultiLatentAttention(const std::string& name, int64_t hidden, int64_t heads, const MlaConfig& config, bool bias,
                       double norm_eps, const RopeTables* rope, double softmax_scale, const TensorParallel& tp = {});
  std::unique_ptr<SublayerCtx> new_ctx() const override { return std::make_unique<MlaCtx>(); }
  Tensor forward(SublayerCtx& ctx, const Tensor& x, int64_t B, int64_t T) override;
  Tensor backward_input(SublayerCtx& ctx, const Tensor& dy, int64_t B, int64_t T) override;
  void backward_weight(SublayerCtx& ctx) override;
  // The cache holds the latent: k [B, max_len, kv_lora_rank + qk_pos_emb_head_dim], no v; f32 under
  // every compute dtype (serve's paged cache holds a bf16 or FP8 latent).
  KVCache new_cache(int64_t B, int64_t max_len, DType dtype) const override;
  Tensor forward_cached(KVCache& cache, const Tensor& x, int64_t B, int64_t T) override;
  // The naive form of forward_cached for the same cache (each step expands the cached latent back
  // into per-head keys and values), to check and measure the absorbed one against.
  Tensor forward_cached_naive(KVCache& cache, const Tensor& x, int64_t B, int64_t T);
  // forward_cached runs the naive form from now on (megaton generate --mla-decode naive).
  void set_naive_decode(bool on) { naive_decode_ = on; }
  // The paged cache keeps the latent alone, [c | k_rope] per token (no values: they are its first
  // kv_lora_rank columns); decoding is the absorbed form over the pages. FP8 pages scale each run of
  // gcd(kv_lora_rank, rope dim) columns on its own (64 for DeepSeek-V3: 8 scales for c, 1 for k_rope,
  // finer than FlashMLA's FP8 cache of 128-column tiles and a bf16 k_rope): with one scale per latent
  // row, a k_rope far larger than c (rope dimensions can carry massive values) would push c's codes
  // into E4M3's subnormals.
  bool paged() const override { return true; }
  PagedLayerSpec paged_layer() const override {
    const int64_t R = config_.kv_lora_rank, r = config_.qk_pos_emb_head_dim;
    return {R + r, std::gcd(R, r), true};
  }
  Tensor forward_paged(PagedKVCache::Layer& layer, const PagedBatch& batch, const Tensor& x) override;
  void set_recompute_core(bool on) override { recompute_core_ = on; }
  void parameters(ParameterList& out) override;
  void gemm_weights(ParameterList& out) override;
  void linears(std::vector<Linear*>& out) override;

  std::unique_ptr<Linear> q_down, q_up;  // with q_lora_rank > 0
  std::unique_ptr<Norm> q_norm;          // with q_lora_rank > 0
  std::unique_ptr<Linear> q_proj;        // with q_lora_rank == 0
  Linear kv_down;
  Norm kv_norm;
  Linear kv_up;
  Linear proj;

 private:
  // What the last query projection reads: RMSNorm(W_q_down x), or x itself without a query latent.
  Tensor query_input(MlaCtx& ctx, const Tensor& x);
  // Query heads [N, heads * qk_dim] in x's dtype (not yet rotated), through the latent or directly.
  Tensor query(MlaCtx& ctx, const Tensor& x);
  Tensor query_backward(MlaCtx& ctx, const Tensor& dq);  // -> dx
  // Rotates (or, inverse, rotates back) the rope part of `heads` heads of width `width` whose
  // rope part starts `at` elements into each head, at positions pos_offset ...
  void rotate(const Tensor& t, int64_t B, int64_t T, int64_t heads, int64_t width, int64_t at, int64_t pos_offset,
              bool inverse) const;
  // f32 keys and values [N, heads * (qk_dim + v)], per head [k_nope | k_rope | v], from the
  // up-projected kv ([N, heads * (nope + v)]) and rows holding each token's rope key at column
  // rope_col (the latent rows [c | k_rope], or the rope keys alone), copied as they are there (the
  // caller rotates them where they are not yet).
  Tensor expand_keys(const Tensor& kv_up_out, const Tensor& rope_keys, int64_t rope_col) const;
  // Decoding: the latent rows of x's T tokens per sequence, f32 [B*T, R + r]: the normalised c and
  // k_rope rotated at positions pos[b] ... for sequence b.
  Tensor latent_rows(const Tensor& x, int64_t B, int64_t T, const std::vector<int64_t>& pos);
  // Appends them to the cache at cache.len, leaving cache.len as it was.
  void append_latent(KVCache& cache, const Tensor& x, int64_t B, int64_t T);
  // The absorbed queries [N, heads * (R + r)] of x's T tokens per sequence, rope parts rotated at pos[b] ...
  Tensor absorbed_query(const Tensor& x, int64_t B, int64_t T, const std::vector<int64_t>& pos);
  // The attention's latent output [N, heads * R] through the absorbed output projection, in x's dtype.
  Tensor absorbed_output(const Tensor& out, const Tensor& x);
  Tensor core_forward(MlaCtx& ctx, int64_t B, int64_t T) const;
  // The current absorbed weights, remade when a weight's version moved.
  const MlaAbsorbed& absorbed();

  MlaConfig config_;
  int64_t hidden_, heads_;
  TensorParallel tp_;
  const RopeTables* rope_;
  double scale_;
  bool recompute_core_ = false;
  bool naive_decode_ = false;
  MlaAbsorbed absorbed_;
  std::vector<uint64_t> absorbed_versions_;
};

}  // namespace megaton::nn
