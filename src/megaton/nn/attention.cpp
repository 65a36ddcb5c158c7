#include "megaton/nn/attention.h"

#include <algorithm>
#include <cmath>

#include "megaton/kernels/attention.h"
#include "megaton/kernels/copy.h"

namespace megaton::nn {

int64_t AttentionShape::fused_row(int64_t r) const {
  const int64_t per_group = heads / groups * head_dim;  // q rows of one group
  if (r < q_size()) return r / per_group * group_size() + r % per_group;
  r -= q_size();
  const int64_t offset = r < kv_size() ? k_offset() : v_offset();
  r %= kv_size();
  return r / head_dim * group_size() + offset + r % head_dim;
}

AttentionShape local_attention_shape(const AttentionShape& g, int tp) {
  if (g.heads % tp != 0)
    fail("num_attention_heads ", g.heads, " is not divisible by tensor_model_parallel_size ", tp);
  if (g.groups % tp != 0 && tp % g.groups != 0)
    fail("num_query_groups ", g.groups, " and tensor_model_parallel_size ", tp,
         ": the kv heads are split when tp divides them and replicated when they divide tp, neither holds");
  return {g.hidden, g.heads / tp, g.groups % tp == 0 ? g.groups / tp : 1, g.head_dim};
}

std::vector<std::vector<ShardPiece>> qkv_pieces(const AttentionShape& g, int tp) {
  const AttentionShape l = local_attention_shape(g, tp);
  if (g.groups % tp == 0) return even_pieces({g.qkv_size()}, tp, "linear_qkv rows");
  // Fewer kv groups than ranks: rank r holds query heads [r * l.heads, ...), inside group g = r / R
  // (R = tp / groups ranks per group), then that group's k and v heads.
  std::vector<std::vector<ShardPiece>> out(static_cast<size_t>(tp));
  const int64_t per_group = tp / g.groups;
  for (int r = 0; r < tp; ++r) {
    const int64_t group = r / per_group, sub = r % per_group;
    const int64_t base = group * g.group_size();
    out[static_cast<size_t>(r)] = {{base + sub * l.q_size(), l.q_size()}, {base + g.k_offset(), 2 * g.head_dim}};
  }
  return out;
}

SelfAttention::SelfAttention(const std::string& name, AttentionShape shape, bool bias, const RopeTables* rope,
                             const TensorParallel& tp)
    : qkv(name + ".linear_qkv", shape.hidden, shape.qkv_size(), bias, LinearParallel::Column, tp,
          qkv_pieces(shape, tp.size())),
      proj(name + ".linear_proj", shape.q_size(), shape.hidden, bias, LinearParallel::Row, tp),
      shape_(local_attention_shape(shape, tp.size())),
      rope_(rope),
      scale_(1.0 / std::sqrt(static_cast<double>(shape.head_dim))) {}

void SelfAttention::rotate(Tensor& buf, int64_t B, int64_t T, int64_t pos_offset, bool inverse) const {
  if (!rope_) return;
  if (pos_offset + T > rope_->cos.size(0))
    fail("attention '", qkv.weight.name, "': position ", pos_offset + T, " beyond the ", rope_->cos.size(0),
         " positions of the rotary tables (max_position_embeddings)");
  // A group's q heads and its k head are adjacent: one call rotates them all and skips v.
  kernels::rope_apply(kernels::ExecContext::on(buf), buf, rope_->cos, rope_->sin, B, T, shape_.groups,
                      shape_.heads / shape_.groups + 1, shape_.head_dim, fused_strides(), pos_offset, rope_->layout,
                      inverse);
}

kernels::HeadStrides SelfAttention::fused_strides() const { return {shape_.qkv_size(), shape_.group_size()}; }

Tensor SelfAttention::forward(SublayerCtx& c, const Tensor& x, int64_t B, int64_t T) {
  FusedInput in = FusedInput::of(x);
  return forward_fused(c, in, B, T);
}

Tensor SelfAttention::forward_fused(SublayerCtx& c, FusedInput& x, int64_t B, int64_t T) {
  auto& ctx = ctx_as<AttentionCtx>(c);
  // RoPE and the softmax statistics compute in fp32 whatever the dtype (as TransformerEngine's bf16
  // attention); a bf16 qkv attends in bf16 where the CPU multiplies bf16 natively, else it is
  // converted to f32 and the output converted back for the projection.
  const Tensor qkv_x = qkv.forward(ctx.qkv_ctx, x);
  const Tensor qa = rotated(qkv_x, B, T);
  ctx.out = as_dtype(core_forward(ctx, qa, B, T), x.dtype());
  ctx.qkv = qa.dtype() == qkv_x.dtype() ? qa : qkv_x;
  return project_attention_output(proj, ctx.proj_ctx, ctx.out, ctx.lse, recompute_core_);
}

Tensor project_attention_output(Linear& proj, LinearCtx& proj_ctx, Tensor& out, Tensor& lse, bool recompute_core) {
  Tensor y = proj.forward(proj_ctx, out);
  if (recompute_core) {  // rebuilt by backward_input; the projection's W gets its input back then
    out = {};
    lse = {};
    proj_ctx.x = {};
  }
  return y;
}

Tensor SelfAttention::core_forward(AttentionCtx& ctx, const Tensor& qa, int64_t B, int64_t T) const {
  Tensor out = new_activation({B * T, shape_.q_size()}, qkv.weight.name + ".attn_out", qa.dtype());
  ctx.lse = new_activation({B, shape_.heads, T}, qkv.weight.name + ".lse");
  kernels::attention_forward(kernels::ExecContext::on(qa), out, ctx.lse, qa, {qa, shape_.k_offset()},
                             {qa, shape_.v_offset()}, B, T, shape_.heads, shape_.groups, shape_.head_dim,
                             fused_strides(), fused_strides(), scale_);
  return out;
}

Tensor SelfAttention::rotated(const Tensor& qkv_x, int64_t B, int64_t T) const {
  // The attention's dtype: the same storage when qkv_x has it already.
  Tensor qa = as_dtype(qkv_x, kernels::attention_dtype(kernels::ExecContext::on(qkv_x), qkv_x.dtype()));
  rotate(qa, B, T, 0, false);
  return qa;
}

Tensor SelfAttention::backward_input(SublayerCtx& c, const Tensor& dy, int64_t B, int64_t T) {
  auto& ctx = ctx_as<AttentionCtx>(c);
  // ctx.qkv is rotated already when it holds the attention's dtype (forward_fused).
  const DType dt = kernels::attention_dtype(kernels::ExecContext::on(ctx.qkv), ctx.qkv.dtype());
  const Tensor qa = ctx.qkv.dtype() == dt ? ctx.qkv : rotated(ctx.qkv, B, T);
  const Tensor dout = as_dtype(proj.backward_input(ctx.proj_ctx, dy), dt);
  Tensor dqkv = new_activation({B * T, shape_.qkv_size()}, qkv.weight.name + ".dqkv", dt);
  const int64_t ko = shape_.k_offset(), vo = shape_.v_offset();
  if (!ctx.out.defined()) {  // core_attn recompute: the same kernel on the same q, k, v
    ctx.out = as_dtype(core_forward(ctx, qa, B, T), dy.dtype());
    if (!ctx.proj_ctx.x_fp8) ctx.proj_ctx.x = ctx.out;  // what the projection's forward read
  }
  const Tensor out_a = as_dtype(ctx.out, dt);
  kernels::attention_backward(kernels::ExecContext::on(qa), dqkv, {dqkv, ko}, {dqkv, vo}, dout, out_a, ctx.lse, qa,
                              {qa, ko}, {qa, vo}, B, T, shape_.heads, shape_.groups, shape_.head_dim, fused_strides(),
                              fused_strides(), scale_);
  rotate(dqkv, B, T, 0, true);  // the rotation is orthogonal: its backward is the inverse rotation
  ctx.qkv = {};
  ctx.out = {};
  ctx.lse = {};
  return qkv.backward_input(ctx.qkv_ctx, as_dtype(dqkv, dy.dtype()));
}

void SelfAttention::backward_weight(SublayerCtx& c) {
  auto& ctx = ctx_as<AttentionCtx>(c);
  proj.backward_weight(ctx.proj_ctx);
  qkv.backward_weight(ctx.qkv_ctx);
}

namespace {

// The first n positions of each batch row of a bf16 cache [B, max_len, cols], widened to f32 as
// [B, n, cols] for the flash kernel: only what the new tokens attend over, not the cache's whole
// capacity (a speculative verification of more than kDecodeRows tokens comes here every step).
Tensor f32_prefix(const Tensor& cache, int64_t n) {
  const int64_t B = cache.size(0), max_len = cache.size(1), cols = cache.size(2);
  Tensor out = new_activation({B, n, cols}, cache.name() + ".f32");
  const Tensor from = cache.view({B * max_len, cols}), to = out.view({B * n, cols});
  for (int64_t b = 0; b < B; ++b)
    to.slice_rows(b * n, (b + 1) * n).copy_from(from.slice_rows(b * max_len, b * max_len + n));
  return out;
}

}  // namespace

KVCache SelfAttention::new_cache(int64_t B, int64_t max_len, DType dtype) const {
  if (dtype != DType::F32 && dtype != DType::BF16) fail("a KV cache holds f32 or bf16, not ", dtype_name(dtype));
  KVCache c;
  c.k = Tensor::zeros({B, max_len, shape_.kv_size()}, dtype, MemCategory::Activations, "kv_cache.k");
  c.v = Tensor::zeros({B, max_len, shape_.kv_size()}, dtype, MemCategory::Activations, "kv_cache.v");
  return c;
}

Tensor SelfAttention::forward_cached(KVCache& cache, const Tensor& x, int64_t B, int64_t T) {
  const int64_t max_len = cache.k.size(1), ks = shape_.kv_size(), G = shape_.groups, D = shape_.head_dim;
  if (cache.len + T > max_len) fail("KV cache of ", max_len, " positions is full (", cache.len, " + ", T, " tokens)");
  LinearCtx scratch;
  Tensor qkv_buf = as_dtype(qkv.forward(scratch, x), DType::F32);
  rotate(qkv_buf, B, T, cache.len, false);
  // Viewed with one group per row, the fused rows' k (or v) heads form a column block of width D,
  // and so do the cache's kv heads: one block copy each appends every group's k or v head.
  const auto on = kernels::ExecContext::on(qkv_buf);
  // A bf16 cache takes the new keys and values rounded to bf16 (as serve's bf16 pages do).
  const Tensor groups = as_dtype(qkv_buf, cache.k.dtype()).view({B, T * G, shape_.group_size()});
  const Tensor k_heads = cache.k.view({B, max_len * G, D}), v_heads = cache.v.view({B, max_len * G, D});
  kernels::copy_rows(on, {k_heads, cache.len * G, 0}, {groups, 0, shape_.k_offset()}, T * G, D);
  kernels::copy_rows(on, {v_heads, cache.len * G, 0}, {groups, 0, shape_.v_offset()}, T * G, D);
  Tensor out = new_activation({B * T, shape_.q_size()}, qkv.weight.name + ".attn_out");
  if (T <= kernels::kDecodeRows) {  // decode steps: one pass over the cache, no lse (nothing runs backward)
    kernels::decode_attention(on, out, qkv_buf, cache.k, cache.v, B, T, shape_.heads, G, D, fused_strides(), {ks, D},
                              scale_, cache.len + T, max_len * ks);
  } else {
    Tensor lse = new_activation({B, shape_.heads, T}, qkv.weight.name + ".lse");
    const bool f32 = cache.k.dtype() == DType::F32;
    const int64_t rows = f32 ? max_len : cache.len + T;  // the keys' positions per batch row, as passed
    const Tensor k = f32 ? cache.k : f32_prefix(cache.k, rows), v = f32 ? cache.v : f32_prefix(cache.v, rows);
    kernels::attention_forward(on, out, lse, qkv_buf, k, v, B, T, shape_.heads, G, D, fused_strides(), {ks, D}, scale_,
                               cache.len, rows * ks);
  }
  cache.len += T;
  LinearCtx proj_scratch;
  return proj.forward(proj_scratch, as_dtype(out, x.dtype()));
}

Tensor SelfAttention::forward_paged(PagedKVCache::Layer& layer, const PagedBatch& batch, const Tensor& x) {
  const int64_t S = static_cast<int64_t>(batch.seqs.size()), T = batch.tokens, ks = shape_.kv_size();
  const int64_t G = shape_.groups, D = shape_.head_dim;
  if (layer.k.size(2) != ks) fail("paged KV layer of ", layer.k.size(2), " columns for attention with ", ks);
  LinearCtx scratch;
  Tensor qkv_buf = as_dtype(qkv.forward(scratch, x), DType::F32);  // [S*T, qkv]
  const auto on = kernels::ExecContext::on(qkv_buf);
  for (int64_t s = 0; s < S; ++s) {  // each sequence's rows at its own positions
    Tensor rows = qkv_buf.slice_rows(s * T, (s + 1) * T);
    rotate(rows, 1, T, batch.seqs[static_cast<size_t>(s)]->len, false);
  }
  // Their k and v heads into the pages (rounded to bf16 for a bf16 cache, each head encoded with its
  // own scale for an FP8 one), the fused rows viewed one group per row as forward_cached appends.
  const bool fp8 = layer.k.dtype() == DType::F8E4M3;
  const Tensor groups = as_dtype(qkv_buf, fp8 ? DType::F32 : layer.k.dtype()).view({1, S * T * G, shape_.group_size()});
  write_pages(on, batch, layer.k, layer.k_scale, G, groups, shape_.k_offset());
  write_pages(on, batch, layer.v, layer.v_scale, G, groups, shape_.v_offset());
  Tensor out = new_activation({S * T, shape_.q_size()}, qkv.weight.name + ".attn_out");
  if (T <= kernels::kDecodeRows) {  // decode steps of every sequence at once, each over its own pages
    kernels::paged_decode_attention(on, out, qkv_buf, layer.k, layer.v, batch.page_table, batch.lens, S, T,
                                    shape_.heads, G, D, fused_strides(), {ks, D}, scale_, layer.k_scale, layer.v_scale);
  } else {  // a prefill chunk: the sequence's keys gathered from its pages, then causal attention
    for (int64_t s = 0; s < S; ++s) {
      const PagedSequence& seq = *batch.seqs[static_cast<size_t>(s)];
      const int64_t Tk = seq.len + T;
      const Tensor k = gather_pages(on, seq, Tk, layer.k, layer.k_scale, G, "paged_k");
      const Tensor v = gather_pages(on, seq, Tk, layer.v, layer.v_scale, G, "paged_v");
      Tensor lse = new_activation({shape_.heads, T}, qkv.weight.name + ".lse");
      kernels::attention_forward(on, out.slice_rows(s * T, (s + 1) * T), lse, {qkv_buf, s * T * shape_.qkv_size()},
                                 as_dtype(k, DType::F32), as_dtype(v, DType::F32), 1, T, shape_.heads, G, D,
                                 fused_strides(), {ks, D}, scale_, seq.len, Tk * ks);
    }
  }
  LinearCtx proj_scratch;
  return proj.forward(proj_scratch, as_dtype(out, x.dtype()));
}

void SelfAttention::parameters(ParameterList& out) {
  qkv.parameters(out);
  proj.parameters(out);
}

void SelfAttention::gemm_weights(ParameterList& out) { out.insert(out.end(), {&qkv.weight, &proj.weight}); }

}  // namespace megaton::nn
