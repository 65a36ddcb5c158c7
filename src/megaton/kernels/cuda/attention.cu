#include "megaton/kernels/cuda/attention.h"

#include "megaton/kernels/cuda/elementwise.cuh"

namespace megaton::kernels::cuda {

namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxPerLane = 8;  // head elements per lane: D <= 32 * 8

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// sum_d a[d] b[d] over a head of D elements, lane l holding d = l + 32 i; a is in registers.
__device__ __forceinline__ float dot(const float (&a)[kMaxPerLane], const float* b, int D, int lane) {
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i)
    if (lane + 32 * i < D) s += a[i] * b[lane + 32 * i];
  return warp_sum(s);
}

__device__ __forceinline__ void load_head(float (&r)[kMaxPerLane], const float* p, int D, int lane) {
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) r[i] = lane + 32 * i < D ? p[lane + 32 * i] : 0.0f;
}

struct Layout {
  int64_t B, Tlen, Hq, Hkv;
  int Dqk, Dv;
  HeadStrides q_at, kv_at;
  float scale;
  int64_t pos_offset, kv_batch;
  __device__ int64_t group_size() const { return Hq / Hkv; }
  // Query head h of token t in batch row b (head h % group_size of group h / group_size).
  __device__ int64_t q_index(int64_t b, int64_t t, int64_t h) const {
    return (b * Tlen + t) * q_at.row + h / group_size() * q_at.group + h % group_size() * Dqk;
  }
  __device__ int64_t kv_index(int64_t b, int64_t j, int64_t g) const {
    return b * kv_batch + j * kv_at.row + g * kv_at.group;
  }
  __device__ int64_t out_index(int64_t b, int64_t t, int64_t h) const { return ((b * Tlen + t) * Hq + h) * Dv; }
  __device__ int64_t lse_index(int64_t b, int64_t t, int64_t h) const { return (b * Hq + h) * Tlen + t; }
};

// One warp per (b, h, t): keys 0..pos_offset + t with an online softmax.
__global__ void forward_kernel(float* out, float* lse, const float* q, const float* k, const float* v, Layout L) {
  const int lane = threadIdx.x % 32;
  const int64_t w = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  if (w >= L.B * L.Hq * L.Tlen) return;
  const int64_t t = w % L.Tlen, h = w / L.Tlen % L.Hq, b = w / L.Tlen / L.Hq, g = h / L.group_size();
  float qr[kMaxPerLane], acc[kMaxPerLane] = {};
  load_head(qr, q + L.q_index(b, t, h), L.Dqk, lane);
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = 0; j <= L.pos_offset + t; ++j) {
    const float s = L.scale * dot(qr, k + L.kv_index(b, j, g), L.Dqk, lane);
    const float m_new = fmaxf(m, s), correction = expf(m - m_new), p = expf(s - m_new);
    l = l * correction + p;
    const float* vj = v + L.kv_index(b, j, g);
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i)
      if (lane + 32 * i < L.Dv) acc[i] = acc[i] * correction + p * vj[lane + 32 * i];
    m = m_new;
  }
  float* o = out + L.out_index(b, t, h);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i)
    if (lane + 32 * i < L.Dv) o[lane + 32 * i] = acc[i] / l;
  if (lane == 0) lse[L.lse_index(b, t, h)] = m + logf(l);
}

// delta[b, h, t] = sum_d dout * out: the softmax backward's row term.
__global__ void delta_kernel(float* delta, const float* dout, const float* out, Layout L) {
  const int lane = threadIdx.x % 32;
  const int64_t w = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  if (w >= L.B * L.Hq * L.Tlen) return;
  const int64_t t = w % L.Tlen, h = w / L.Tlen % L.Hq, b = w / L.Tlen / L.Hq;
  float o[kMaxPerLane];
  load_head(o, out + L.out_index(b, t, h), L.Dv, lane);
  const float s = dot(o, dout + L.out_index(b, t, h), L.Dv, lane);
  if (lane == 0) delta[L.lse_index(b, t, h)] = s;
}

// dq of (b, h, t) = scale * sum_j P_tj (dO_t . v_j - delta_t) k_j over the keys it saw.
__global__ void dq_kernel(float* dq, const float* dout, const float* lse, const float* delta, const float* q,
                          const float* k, const float* v, Layout L) {
  const int lane = threadIdx.x % 32;
  const int64_t w = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  if (w >= L.B * L.Hq * L.Tlen) return;
  const int64_t t = w % L.Tlen, h = w / L.Tlen % L.Hq, b = w / L.Tlen / L.Hq, g = h / L.group_size();
  float qr[kMaxPerLane], dor[kMaxPerLane], acc[kMaxPerLane] = {};
  load_head(qr, q + L.q_index(b, t, h), L.Dqk, lane);
  load_head(dor, dout + L.out_index(b, t, h), L.Dv, lane);
  const float lse_t = lse[L.lse_index(b, t, h)], delta_t = delta[L.lse_index(b, t, h)];
  for (int64_t j = 0; j <= t; ++j) {
    const float* kj = k + L.kv_index(b, j, g);
    const float p = expf(L.scale * dot(qr, kj, L.Dqk, lane) - lse_t);
    const float ds = p * (dot(dor, v + L.kv_index(b, j, g), L.Dv, lane) - delta_t);
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i)
      if (lane + 32 * i < L.Dqk) acc[i] += ds * kj[lane + 32 * i];
  }
  float* d = dq + L.q_index(b, t, h);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i)
    if (lane + 32 * i < L.Dqk) d[lane + 32 * i] = L.scale * acc[i];
}

// dk, dv of key j of kv head g in batch row b: sums over the group's query heads and the queries
// t >= j that saw it.
__global__ void dkv_kernel(float* dk, float* dv, const float* dout, const float* lse, const float* delta,
                           const float* q, const float* k, const float* v, Layout L) {
  const int lane = threadIdx.x % 32;
  const int64_t w = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  if (w >= L.B * L.Hkv * L.Tlen) return;
  const int64_t j = w % L.Tlen, g = w / L.Tlen % L.Hkv, b = w / L.Tlen / L.Hkv;
  float kr[kMaxPerLane], vr[kMaxPerLane], dk_acc[kMaxPerLane] = {}, dv_acc[kMaxPerLane] = {};
  load_head(kr, k + L.kv_index(b, j, g), L.Dqk, lane);
  load_head(vr, v + L.kv_index(b, j, g), L.Dv, lane);
  for (int64_t h = g * L.group_size(); h < (g + 1) * L.group_size(); ++h)
    for (int64_t t = j; t < L.Tlen; ++t) {
      const float* qt = q + L.q_index(b, t, h);
      const float* dot_t = dout + L.out_index(b, t, h);
      const float p = expf(L.scale * dot(kr, qt, L.Dqk, lane) - lse[L.lse_index(b, t, h)]);
      const float ds = p * (dot(vr, dot_t, L.Dv, lane) - delta[L.lse_index(b, t, h)]);
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        if (lane + 32 * i < L.Dv) dv_acc[i] += p * dot_t[lane + 32 * i];
        if (lane + 32 * i < L.Dqk) dk_acc[i] += ds * qt[lane + 32 * i];
      }
    }
  float* dkj = dk + L.kv_index(b, j, g);
  float* dvj = dv + L.kv_index(b, j, g);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    if (lane + 32 * i < L.Dqk) dkj[lane + 32 * i] = L.scale * dk_acc[i];
    if (lane + 32 * i < L.Dv) dvj[lane + 32 * i] = dv_acc[i];
  }
}

// Blocks of kWarpsPerBlock warps, one warp per row.
unsigned warp_blocks(int64_t warps, std::string_view op) {
  return detail::grid_blocks((warps + kWarpsPerBlock - 1) / kWarpsPerBlock, op);
}

Layout make_layout(std::string_view op, const Tensor& q, int64_t B, int64_t Tlen, int64_t Hq, int64_t Hkv, HeadDim D,
                   HeadStrides q_at, HeadStrides kv_at, double scale, int64_t pos_offset, int64_t kv_batch) {
  if (q.dtype() != DType::F32)
    fail("kernel ", op, " on cuda: tensor '", q.name(), "' holds ", dtype_name(q.dtype()), ", expected f32");
  if (D.qk > 32 * kMaxPerLane || D.v > 32 * kMaxPerLane)
    fail("kernel ", op, " on cuda: head dims ", D.qk, " / ", D.v, " exceed ", 32 * kMaxPerLane);
  return {B,
          Tlen,
          Hq,
          Hkv,
          static_cast<int>(D.qk),
          static_cast<int>(D.v),
          q_at,
          kv_at,
          static_cast<float>(scale),
          pos_offset,
          kv_batch};
}

float* at(const TensorAt& x) { return static_cast<float*>(x.t.raw()) + x.offset; }

}  // namespace

void attention_forward(const ExecContext& ctx, const Tensor& out, const Tensor& lse, TensorAt q, TensorAt k, TensorAt v,
                       int64_t B, int64_t Tlen, int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at, HeadStrides kv_at,
                       double scale, int64_t pos_offset, int64_t kv_batch_stride) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  const Layout L =
      make_layout("attention_forward", q.t, B, Tlen, Hq, Hkv, D, q_at, kv_at, scale, pos_offset, kv_batch_stride);
  const int64_t rows = B * Hq * Tlen;
  if (rows == 0) return;
  forward_kernel<<<warp_blocks(rows, "attention_forward"), 32 * kWarpsPerBlock, 0, detail::stream_of(ctx)>>>(
      static_cast<float*>(out.raw()), static_cast<float*>(lse.raw()), at(q), at(k), at(v), L);
  MEGATON_CUDA_LAUNCH_CHECK();
}

void attention_backward(const ExecContext& ctx, TensorAt dq, TensorAt dk, TensorAt dv, const Tensor& dout,
                        const Tensor& out, const Tensor& lse, TensorAt q, TensorAt k, TensorAt v, int64_t B,
                        int64_t Tlen, int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at, HeadStrides kv_at,
                        double scale) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  const Layout L = make_layout("attention_backward", q.t, B, Tlen, Hq, Hkv, D, q_at, kv_at, scale, 0, Tlen * kv_at.row);
  const int64_t rows = B * Hq * Tlen;
  if (rows == 0) return;
  const cudaStream_t stream = detail::stream_of(ctx);
  Tensor delta = Tensor::empty({B * Hq, Tlen}, DType::F32, MemCategory::Workspace, "attention_delta", ctx.device);
  auto* dl = static_cast<float*>(delta.raw());
  const auto* o = static_cast<const float*>(out.raw());
  const auto* d_o = static_cast<const float*>(dout.raw());
  const auto* ls = static_cast<const float*>(lse.raw());
  delta_kernel<<<warp_blocks(rows, "attention_backward"), 32 * kWarpsPerBlock, 0, stream>>>(dl, d_o, o, L);
  MEGATON_CUDA_LAUNCH_CHECK();
  dq_kernel<<<warp_blocks(rows, "attention_backward"), 32 * kWarpsPerBlock, 0, stream>>>(at(dq), d_o, ls, dl, at(q),
                                                                                         at(k), at(v), L);
  MEGATON_CUDA_LAUNCH_CHECK();
  dkv_kernel<<<warp_blocks(B * Hkv * Tlen, "attention_backward"), 32 * kWarpsPerBlock, 0, stream>>>(
      at(dk), at(dv), d_o, ls, dl, at(q), at(k), at(v), L);
  MEGATON_CUDA_LAUNCH_CHECK();
}

}  // namespace megaton::kernels::cuda
