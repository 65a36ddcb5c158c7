// MultiLatentAttention's decoding (mla_attention.h): the latent cache, the absorbed form and the
// naive form it must equal.
#include "megaton/kernels/attention.h"
#include "megaton/kernels/copy.h"
#include "megaton/kernels/linear.h"
#include "megaton/nn/mla_attention.h"

namespace megaton::nn {

namespace {
using kernels::ExecContext;

void expect_room(const KVCache& cache, int64_t T) {
  const int64_t max_len = cache.k.size(1);
  if (cache.len + T > max_len) fail("KV cache of ", max_len, " positions is full (", cache.len, " + ", T, " tokens)");
}
}  // namespace

KVCache MultiLatentAttention::new_cache(int64_t B, int64_t max_len) const {
  KVCache c;
  c.k = Tensor::zeros({B, max_len, config_.kv_lora_rank + config_.qk_pos_emb_head_dim}, DType::F32,
                      MemCategory::Activations, "kv_cache.latent");
  return c;
}

void MultiLatentAttention::append_latent(KVCache& cache, const Tensor& x, int64_t B, int64_t T) {
  const int64_t N = B * T, R = config_.kv_lora_rank, r = config_.qk_pos_emb_head_dim;
  expect_room(cache, T);
  LinearCtx down_ctx;
  NormCtx norm_ctx;
  // f32 latent rows [c | k_rope]: k_rope rotated in place (an f32 linear output no one else keeps).
  const Tensor latent = as_dtype(kv_down.forward(down_ctx, x), DType::F32);
  rotate(latent, B, T, 1, R + r, R, cache.len, false);
  Tensor c = new_activation({N, R}, kv_down.weight.name + ".latent", x.dtype());
  const auto on = ExecContext::on(latent);
  const Tensor x_latent = as_dtype(latent, x.dtype());
  kernels::copy_rows(on, {c.view({1, N, R}), 0, 0}, {x_latent.view({1, N, R + r}), 0, 0}, N, R);
  const Tensor c_n = as_dtype(kv_norm.forward(norm_ctx, c), DType::F32);
  kernels::copy_rows(on, {cache.k, cache.len, 0}, {c_n.view({B, T, R}), 0, 0}, T, R);
  kernels::copy_rows(on, {cache.k, cache.len, R}, {latent.view({B, T, R + r}), 0, R}, T, r);
}

Tensor MultiLatentAttention::forward_cached(KVCache& cache, const Tensor& x, int64_t B, int64_t T) {
  if (naive_decode_) return forward_cached_naive(cache, x, B, T);
  const int64_t N = B * T, R = config_.kv_lora_rank, r = config_.qk_pos_emb_head_dim, max_len = cache.k.size(1);
  append_latent(cache, x, B, T);
  const MlaAbsorbed& a = absorbed();
  // The query latent (or x itself), then each head's absorbed query [W_uk^T q_nope | q_rope].
  MlaCtx scratch;
  const Tensor q_in = query_input(scratch, x);
  const auto on = ExecContext::on(x);
  Tensor q = new_activation({N, heads_ * (R + r)}, proj.weight.name + ".absorbed_q");
  kernels::linear_forward(on, q, as_dtype(q_in, DType::F32), a.q_weight, {});
  rotate(q, B, T, heads_, R + r, R, cache.len, false);
  // Multi-query attention over the latent: one kv head, keys [c | k_rope], values c.
  Tensor out = new_activation({N, heads_ * R}, proj.weight.name + ".latent_out");
  Tensor lse = new_activation({B, heads_, T}, proj.weight.name + ".lse");
  kernels::attention_forward(on, out, lse, q, {cache.k, 0}, {cache.k, 0}, B, T, heads_, 1, kernels::HeadDim{R + r, R},
                             {heads_ * (R + r), heads_ * (R + r)}, {R + r, R + r}, scale_, cache.len,
                             max_len * (R + r));
  cache.len += T;
  Tensor y = new_activation({N, hidden_}, proj.weight.name + ".out");
  kernels::linear_forward(on, y, out, a.proj_weight, proj.bias.value);
  return as_dtype(y, x.dtype());
}

Tensor MultiLatentAttention::forward_cached_naive(KVCache& cache, const Tensor& x, int64_t B, int64_t T) {
  const int64_t R = config_.kv_lora_rank, r = config_.qk_pos_emb_head_dim, L = cache.len + T;
  const int64_t qk = config_.qk_dim(), v = config_.v_head_dim;
  append_latent(cache, x, B, T);
  // Every cached token's keys and values again, from its latent.
  Tensor latent = new_activation({B * L, R + r}, kv_down.weight.name + ".cached_latent");
  Tensor c = new_activation({B * L, R}, kv_down.weight.name + ".cached_c");
  const auto on = ExecContext::on(latent);
  kernels::copy_rows(on, {latent.view({B, L, R + r}), 0, 0}, {cache.k, 0, 0}, L, R + r);
  kernels::copy_rows(on, {c.view({1, B * L, R}), 0, 0}, {latent.view({1, B * L, R + r}), 0, 0}, B * L, R);
  LinearCtx up_ctx;
  const Tensor kv = expand_keys(kv_up.forward(up_ctx, as_dtype(c, x.dtype())), latent, R);  // k_rope already rotated
  MlaCtx scratch;
  const Tensor q = as_dtype(query(scratch, x), DType::F32);
  rotate(q, B, T, heads_, qk, config_.qk_head_dim, cache.len, false);
  Tensor out = new_activation({B * T, heads_ * v}, proj.weight.name + ".attn_out");
  Tensor lse = new_activation({B, heads_, T}, proj.weight.name + ".lse");
  kernels::attention_forward(on, out, lse, q, {kv, 0}, {kv, qk}, B, T, heads_, heads_, kernels::HeadDim{qk, v},
                             {heads_ * qk, qk}, {heads_ * (qk + v), qk + v}, scale_, cache.len);
  cache.len += T;
  LinearCtx proj_ctx;
  return proj.forward(proj_ctx, as_dtype(out, x.dtype()));
}

const MlaAbsorbed& MultiLatentAttention::absorbed() {
  const Parameter& wq = q_proj ? q_proj->weight : q_up->weight;
  const std::vector<uint64_t> versions{wq.version, kv_up.weight.version, proj.weight.version};
  if (absorbed_.q_weight.defined() && versions == absorbed_versions_) return absorbed_;
  const Linear& q_last = q_proj ? *q_proj : *q_up;
  if (q_last.bias.value.defined() || kv_up.bias.value.defined())
    fail("attention '", proj.weight.name, "': absorbed multi-latent decoding needs the query and kv up-projections "
         "without biases (add_bias_linear = false)");
  const int64_t R = config_.kv_lora_rank, r = config_.qk_pos_emb_head_dim, nope = config_.qk_head_dim;
  const int64_t v = config_.v_head_dim, qk = config_.qk_dim(), Q = wq.value.size(1), C = hidden_;
  const Tensor& w_kv = kv_up.weight.value;
  absorbed_.q_weight = Tensor::zeros({heads_ * (R + r), Q}, DType::F32, MemCategory::Workspace, wq.name + ".absorbed");
  absorbed_.proj_weight = Tensor::empty({C, heads_ * R}, DType::F32, MemCategory::Workspace, proj.weight.name + ".absorbed");
  const auto on = ExecContext::on(w_kv);
  Tensor proj_h = Tensor::empty({C, v}, DType::F32, MemCategory::Workspace, "proj_head");
  Tensor folded_h = Tensor::empty({C, R}, DType::F32, MemCategory::Workspace, "proj_folded_head");
  for (int64_t h = 0; h < heads_; ++h) {
    const int64_t kv_row = h * (nope + v), q_row = h * (R + r);
    const Tensor w_uk = w_kv.slice_rows(kv_row, kv_row + nope), w_uv = w_kv.slice_rows(kv_row + nope, kv_row + nope + v);
    // Query rows: W_uk^T W_q_nope (the weight-gradient GEMM computes dout^T x), then W_q_rope as it is.
    kernels::linear_backward_weight(on, absorbed_.q_weight.slice_rows(q_row, q_row + R), {}, w_uk,
                                    wq.value.slice_rows(h * qk, h * qk + nope));
    absorbed_.q_weight.slice_rows(q_row + R, q_row + R + r).copy_from(wq.value.slice_rows(h * qk + nope, (h + 1) * qk));
    // Output columns: W_proj_h W_uv (the input-gradient GEMM computes dout w).
    kernels::copy_rows(on, {proj_h.view({1, C, v}), 0, 0}, {proj.weight.value.view({1, C, heads_ * v}), 0, h * v}, C, v);
    kernels::linear_backward_input(on, folded_h, proj_h, w_uv);
    kernels::copy_rows(on, {absorbed_.proj_weight.view({1, C, heads_ * R}), 0, h * R}, {folded_h.view({1, C, R}), 0, 0},
                       C, R);
  }
  absorbed_versions_ = versions;
  return absorbed_;
}

}  // namespace megaton::nn
