#include "megaton/nn/attention.h"

#include <cmath>

#include "megaton/kernels/attention.h"
#include "megaton/kernels/copy.h"

namespace megaton::nn {

SelfAttention::SelfAttention(const std::string& name, AttentionShape shape, bool bias, const RopeTables* rope)
    : qkv(name + ".linear_qkv", shape.hidden, shape.qkv_size(), bias, LinearParallel::Column),
      proj(name + ".linear_proj", shape.q_size(), shape.hidden, bias, LinearParallel::Row),
      shape_(shape),
      rope_(rope),
      scale_(1.0 / std::sqrt(static_cast<double>(shape.head_dim))) {}

void SelfAttention::rotate(Tensor& buf, int64_t B, int64_t T, int64_t pos_offset, bool inverse) const {
  if (!rope_) return;
  if (pos_offset + T > rope_->cos.size(0))
    fail("attention '", qkv.weight.name, "': position ", pos_offset + T, " beyond the ", rope_->cos.size(0),
         " positions of the rotary tables (max_position_embeddings)");
  float* base = buf.data<float>();
  const int64_t stride = shape_.qkv_size();
  const float* c = rope_->cos.data<float>();
  const float* s = rope_->sin.data<float>();
  kernels::rope_apply(base, c, s, B, T, shape_.heads, shape_.head_dim, stride, pos_offset, rope_->layout, inverse);
  kernels::rope_apply(base + shape_.q_size(), c, s, B, T, shape_.groups, shape_.head_dim, stride, pos_offset,
                      rope_->layout, inverse);
}

Tensor SelfAttention::forward(AttentionCtx& ctx, const Tensor& x, int64_t B, int64_t T) {
  ctx.qkv = qkv.forward(ctx.qkv_ctx, x);
  rotate(ctx.qkv, B, T, 0, false);
  const int64_t stride = shape_.qkv_size();
  const float* q = ctx.qkv.data<float>();
  ctx.out = new_activation({B * T, shape_.q_size()}, qkv.weight.name + ".attn_out");
  ctx.lse = new_activation({B, shape_.heads, T}, qkv.weight.name + ".lse");
  kernels::attention_forward(ctx.out.data<float>(), ctx.lse.data<float>(), q, q + shape_.q_size(),
                             q + shape_.q_size() + shape_.kv_size(), B, T, shape_.heads, shape_.groups,
                             shape_.head_dim, stride, stride, scale_);
  return proj.forward(ctx.proj_ctx, ctx.out);
}

Tensor SelfAttention::backward_input(AttentionCtx& ctx, const Tensor& dy, int64_t B, int64_t T) {
  Tensor dout = proj.backward_input(ctx.proj_ctx, dy);
  Tensor dqkv = new_activation({B * T, shape_.qkv_size()}, qkv.weight.name + ".dqkv");
  const int64_t stride = shape_.qkv_size(), qs = shape_.q_size(), ks = shape_.kv_size();
  const float* q = ctx.qkv.data<float>();
  float* dq = dqkv.data<float>();
  kernels::attention_backward(dq, dq + qs, dq + qs + ks, dout.data<float>(), ctx.out.data<float>(),
                              ctx.lse.data<float>(), q, q + qs, q + qs + ks, B, T, shape_.heads, shape_.groups,
                              shape_.head_dim, stride, stride, scale_);
  rotate(dqkv, B, T, 0, true);  // the rotation is orthogonal: its backward is the inverse rotation
  ctx.qkv = {};
  ctx.out = {};
  ctx.lse = {};
  return qkv.backward_input(ctx.qkv_ctx, dqkv);
}

void SelfAttention::backward_weight(AttentionCtx& ctx) {
  proj.backward_weight(ctx.proj_ctx);
  qkv.backward_weight(ctx.qkv_ctx);
}

KVCache SelfAttention::new_cache(int64_t B, int64_t max_len) const {
  KVCache c;
  c.k = Tensor::zeros({B, max_len, shape_.kv_size()}, DType::F32, MemCategory::Activations, "kv_cache.k");
  c.v = Tensor::zeros({B, max_len, shape_.kv_size()}, DType::F32, MemCategory::Activations, "kv_cache.v");
  return c;
}

Tensor SelfAttention::forward_cached(KVCache& cache, const Tensor& x, int64_t B, int64_t T) {
  const int64_t max_len = cache.k.size(1), ks = shape_.kv_size(), qs = shape_.q_size(), stride = shape_.qkv_size();
  if (cache.len + T > max_len) fail("KV cache of ", max_len, " positions is full (", cache.len, " + ", T, " tokens)");
  LinearCtx scratch;
  Tensor qkv_buf = qkv.forward(scratch, x);
  rotate(qkv_buf, B, T, cache.len, false);
  const auto on = kernels::ExecContext::on(qkv_buf);
  const Tensor rows = qkv_buf.view({B, T, stride});
  kernels::copy_rows(on, {cache.k, cache.len, 0}, {rows, 0, qs}, T, ks);
  kernels::copy_rows(on, {cache.v, cache.len, 0}, {rows, 0, qs + ks}, T, ks);
  const float* src = qkv_buf.data<float>();
  const float* kc = cache.k.data<float>();
  const float* vc = cache.v.data<float>();
  Tensor out = new_activation({B * T, qs}, qkv.weight.name + ".attn_out");
  Tensor lse = new_activation({B, shape_.heads, T}, qkv.weight.name + ".lse");
  kernels::attention_forward(out.data<float>(), lse.data<float>(), src, kc, vc, B, T, shape_.heads, shape_.groups,
                             shape_.head_dim, stride, ks, scale_, cache.len, max_len * ks);
  cache.len += T;
  LinearCtx proj_scratch;
  return proj.forward(proj_scratch, out);
}

void SelfAttention::parameters(ParameterList& out) {
  qkv.parameters(out);
  proj.parameters(out);
}

}  // namespace megaton::nn
