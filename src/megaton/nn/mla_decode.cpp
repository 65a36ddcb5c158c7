// MultiLatentAttention's decoding (mla_attention.h): the latent cache, the absorbed form and the
// naive form it must equal.
#include <algorithm>
#include <vector>

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

KVCache MultiLatentAttention::new_cache(int64_t B, int64_t max_len, DType /*dtype*/) const {
  KVCache c;
  c.k = Tensor::zeros({B, max_len, config_.kv_lora_rank + config_.qk_pos_emb_head_dim}, DType::F32,
                      MemCategory::Activations, "kv_cache.latent");
  return c;
}

Tensor MultiLatentAttention::latent_rows(const Tensor& x, int64_t B, int64_t T, const std::vector<int64_t>& pos) {
  const int64_t N = B * T, R = config_.kv_lora_rank, r = config_.qk_pos_emb_head_dim;
  LinearCtx down_ctx;
  NormCtx norm_ctx;
  // f32 latent rows [c | k_rope]: k_rope rotated in place (an f32 linear output no one else keeps).
  const Tensor latent = as_dtype(kv_down.forward(down_ctx, x), DType::F32);
  for (int64_t b = 0; b < B; ++b) rotate(latent.slice_rows(b * T, (b + 1) * T), 1, T, 1, R + r, R, pos[b], false);
  Tensor c = new_activation({N, R}, kv_down.weight.name + ".latent", x.dtype());
  const auto on = ExecContext::on(latent);
  const Tensor x_latent = as_dtype(latent, x.dtype());
  kernels::copy_rows(on, {c.view({1, N, R}), 0, 0}, {x_latent.view({1, N, R + r}), 0, 0}, N, R);
  const Tensor c_n = as_dtype(kv_norm.forward(norm_ctx, c), DType::F32);
  kernels::copy_rows(on, {latent.view({1, N, R + r}), 0, 0}, {c_n.view({1, N, R}), 0, 0}, N, R);
  return latent;
}

void MultiLatentAttention::append_latent(KVCache& cache, const Tensor& x, int64_t B, int64_t T) {
  const int64_t W = config_.kv_lora_rank + config_.qk_pos_emb_head_dim;
  expect_room(cache, T);
  const Tensor latent = latent_rows(x, B, T, std::vector<int64_t>(static_cast<size_t>(B), cache.len));
  kernels::copy_rows(ExecContext::on(latent), {cache.k, cache.len, 0}, {latent.view({B, T, W}), 0, 0}, T, W);
}

Tensor MultiLatentAttention::absorbed_query(const Tensor& x, int64_t B, int64_t T, const std::vector<int64_t>& pos) {
  const int64_t R = config_.kv_lora_rank, r = config_.qk_pos_emb_head_dim;
  // The query latent (or x itself), then each head's absorbed query [W_uk^T q_nope | q_rope].
  MlaCtx scratch;
  const Tensor q_in = query_input(scratch, x);
  Tensor q = new_activation({B * T, heads_ * (R + r)}, proj.weight.name + ".absorbed_q");
  kernels::linear_forward(ExecContext::on(x), q, as_dtype(q_in, DType::F32), absorbed().q_weight, {});
  for (int64_t b = 0; b < B; ++b) rotate(q.slice_rows(b * T, (b + 1) * T), 1, T, heads_, R + r, R, pos[b], false);
  return q;
}

Tensor MultiLatentAttention::absorbed_output(const Tensor& out, const Tensor& x) {
  Tensor y = new_activation({out.size(0), hidden_}, proj.weight.name + ".out");
  kernels::linear_forward(ExecContext::on(out), y, out, absorbed().proj_weight, proj.bias.value);
  return as_dtype(y, x.dtype());
}

Tensor MultiLatentAttention::forward_cached(KVCache& cache, const Tensor& x, int64_t B, int64_t T) {
  if (naive_decode_) return forward_cached_naive(cache, x, B, T);
  const int64_t N = B * T, R = config_.kv_lora_rank, r = config_.qk_pos_emb_head_dim, W = R + r,
                max_len = cache.k.size(1);
  append_latent(cache, x, B, T);
  const Tensor q = absorbed_query(x, B, T, std::vector<int64_t>(static_cast<size_t>(B), cache.len));
  const auto on = ExecContext::on(x);
  // Multi-query attention over the latent: one kv head, keys [c | k_rope], values c.
  Tensor out = new_activation({N, heads_ * R}, proj.weight.name + ".latent_out");
  const kernels::HeadDim D{W, R};
  if (T <= kernels::kDecodeRows) {  // decode steps: the latent read once for all heads (as the paged cache does)
    kernels::decode_attention(on, out, q, {cache.k, 0}, {cache.k, 0}, B, T, heads_, 1, D, {heads_ * W, heads_ * W},
                              {W, W}, scale_, cache.len + T, max_len * W);
  } else {
    Tensor lse = new_activation({B, heads_, T}, proj.weight.name + ".lse");
    kernels::attention_forward(on, out, lse, q, {cache.k, 0}, {cache.k, 0}, B, T, heads_, 1, D,
                               {heads_ * W, heads_ * W}, {W, W}, scale_, cache.len, max_len * W);
  }
  cache.len += T;
  return absorbed_output(out, x);
}

Tensor MultiLatentAttention::forward_paged(PagedKVCache::Layer& layer, const PagedBatch& batch, const Tensor& x) {
  const int64_t S = static_cast<int64_t>(batch.seqs.size()), T = batch.tokens, N = S * T;
  const int64_t R = config_.kv_lora_rank, W = R + config_.qk_pos_emb_head_dim;
  if (layer.k.size(2) != W) fail("paged KV layer of ", layer.k.size(2), " columns for a latent of ", W);
  std::vector<int64_t> pos;
  for (const PagedSequence* seq : batch.seqs) pos.push_back(seq->len);
  const Tensor latent = latent_rows(x, S, T, pos);
  const auto on = ExecContext::on(latent);
  // The latent rows into the pages (rounded to bf16 for a bf16 cache; FP8: each row as the runs of
  // columns its scales cover, paged_layer()).
  const bool fp8 = layer.k_scale.defined();
  const int64_t units = fp8 ? layer.k_scale.size(2) : 1;
  write_pages(on, batch, layer.k, layer.k_scale, units,
              (fp8 ? latent : as_dtype(latent, layer.k.dtype())).view({1, N * units, W / units}), 0);
  const Tensor q = absorbed_query(x, S, T, pos);
  Tensor out = new_activation({N, heads_ * R}, proj.weight.name + ".latent_out");
  const kernels::HeadDim D{W, R};
  const kernels::HeadStrides q_at{heads_ * W, heads_ * W}, kv_at{W, W};
  if (T <= kernels::kDecodeRows) {  // decode steps of every sequence at once, each over its own pages
    kernels::paged_decode_attention(on, out, q, layer.k, layer.k, batch.page_table, batch.lens, S, T, heads_, 1, D,
                                    q_at, kv_at, scale_, layer.k_scale, layer.k_scale);
  } else {  // a prefill chunk: the sequence's latent gathered from its pages, then causal attention
    for (int64_t s = 0; s < S; ++s) {
      const PagedSequence& seq = *batch.seqs[static_cast<size_t>(s)];
      const int64_t Tk = seq.len + T;
      const Tensor k = as_dtype(gather_pages(on, seq, Tk, layer.k, layer.k_scale, units, "paged_latent"), DType::F32);
      Tensor lse = new_activation({heads_, T}, proj.weight.name + ".lse");
      kernels::attention_forward(on, out.slice_rows(s * T, (s + 1) * T), lse, {q, s * T * heads_ * W}, k, k, 1, T,
                                 heads_, 1, D, q_at, kv_at, scale_, seq.len, Tk * W);
    }
  }
  return absorbed_output(out, x);
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
  // The products are made in f32, from weights held in bf16 or as codes alone too (a model built to serve).
  const Tensor w_q = f32_values(wq), w_kv = f32_values(kv_up.weight), w_proj = f32_values(proj.weight);
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
                                    w_q.slice_rows(h * qk, h * qk + nope));
    absorbed_.q_weight.slice_rows(q_row + R, q_row + R + r).copy_from(w_q.slice_rows(h * qk + nope, (h + 1) * qk));
    // Output columns: W_proj_h W_uv (the input-gradient GEMM computes dout w).
    kernels::copy_rows(on, {proj_h.view({1, C, v}), 0, 0}, {w_proj.view({1, C, heads_ * v}), 0, h * v}, C, v);
    kernels::linear_backward_input(on, folded_h, proj_h, w_uv);
    kernels::copy_rows(on, {absorbed_.proj_weight.view({1, C, heads_ * R}), 0, h * R}, {folded_h.view({1, C, R}), 0, 0},
                       C, R);
  }
  absorbed_versions_ = versions;
  return absorbed_;
}

}  // namespace megaton::nn
