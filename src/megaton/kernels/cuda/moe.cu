#include "megaton/kernels/cuda/moe.h"

#include "megaton/kernels/cuda/elementwise.cuh"

namespace megaton::kernels::cuda {

namespace {

constexpr int kThreads = 256;  // a power of two: detail::block_sum's tree halves it

// One block per slot (n, k): out[pos] = x[n].
template <typename T>
__global__ void permute_kernel(T* out, const T* x, const int32_t* pos, int64_t K, int64_t C) {
  const int64_t slot = blockIdx.x, p = pos[slot];
  if (p < 0) return;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[p * C + c] = x[slot / K * C + c];
}

// One block per token n: out[n] = sum_k w_k src[pos[n, k]] over its kept slots, in slot order (w = 1
// without probs): permute's backward and unpermute.
template <typename T>
__global__ void gather_sum_kernel(T* out, const T* src, const int32_t* pos, const T* probs, int64_t K, int64_t C) {
  const int64_t n = blockIdx.x;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t p = pos[n * K + k];
      if (p >= 0) acc += (probs ? detail::load(probs, n * K + k) : 1.0f) * detail::load(src, p * C + c);
    }
    detail::store(out, n * C + c, acc);
  }
}

// One block per slot (n, k): drows[pos] = w dy[n] and dprobs[n, k] = dy[n] . rows[pos] (0 when dropped).
template <typename T>
__global__ void unpermute_backward_kernel(T* drows, T* dprobs, const T* dy, const T* rows, const int32_t* pos,
                                          const T* probs, int64_t K, int64_t C) {
  __shared__ float shared[kThreads];
  const int64_t slot = blockIdx.x, n = slot / K, p = pos[slot];
  if (p < 0) {
    if (threadIdx.x == 0) detail::store(dprobs, slot, 0.0f);
    return;
  }
  const float w = detail::load(probs, slot);
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = detail::load(dy, n * C + c);
    detail::store(drows, p * C + c, w * d);
    dot += d * detail::load(rows, p * C + c);
  }
  dot = detail::block_sum(dot, shared);
  if (threadIdx.x == 0) detail::store(dprobs, slot, dot);
}

}  // namespace

void moe_permute(const ExecContext& ctx, const Tensor& out, const Tensor& x, const Tensor& pos, int64_t N, int64_t K,
                 int64_t C) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  if (N * K == 0) return;
  detail::dispatch_io("moe_permute", x, {&out}, [&]<typename T>(T) {
    permute_kernel<<<detail::grid_blocks(N * K, "moe_permute"), kThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<T*>(out.raw()), static_cast<const T*>(x.raw()), static_cast<const int32_t*>(pos.raw()), K, C);
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

void moe_permute_backward(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& pos, int64_t N,
                          int64_t K, int64_t C) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  if (N == 0) return;
  detail::dispatch_io("moe_permute_backward", dx, {&dout}, [&]<typename T>(T) {
    gather_sum_kernel<<<detail::grid_blocks(N, "moe_permute_backward"), kThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<T*>(dx.raw()), static_cast<const T*>(dout.raw()), static_cast<const int32_t*>(pos.raw()),
        static_cast<const T*>(nullptr), K, C);
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

void moe_unpermute(const ExecContext& ctx, const Tensor& y, const Tensor& rows, const Tensor& pos, const Tensor& probs,
                   int64_t N, int64_t K, int64_t C) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  if (N == 0) return;
  detail::dispatch_io("moe_unpermute", y, {&rows, &probs}, [&]<typename T>(T) {
    gather_sum_kernel<<<detail::grid_blocks(N, "moe_unpermute"), kThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<T*>(y.raw()), static_cast<const T*>(rows.raw()), static_cast<const int32_t*>(pos.raw()),
        static_cast<const T*>(probs.raw()), K, C);
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

void moe_unpermute_backward(const ExecContext& ctx, const Tensor& drows, const Tensor& dprobs, const Tensor& dy,
                            const Tensor& rows, const Tensor& pos, const Tensor& probs, int64_t N, int64_t K,
                            int64_t C) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  if (N * K == 0) return;
  detail::dispatch_io("moe_unpermute_backward", dy, {&drows, &dprobs, &rows, &probs}, [&]<typename T>(T) {
    unpermute_backward_kernel<<<detail::grid_blocks(N * K, "moe_unpermute_backward"), kThreads, 0,
                                detail::stream_of(ctx)>>>(
        static_cast<T*>(drows.raw()), static_cast<T*>(dprobs.raw()), static_cast<const T*>(dy.raw()),
        static_cast<const T*>(rows.raw()), static_cast<const int32_t*>(pos.raw()), static_cast<const T*>(probs.raw()),
        K, C);
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

}  // namespace megaton::kernels::cuda
