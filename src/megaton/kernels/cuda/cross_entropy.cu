#include <cmath>

#include "megaton/kernels/cuda/cross_entropy.h"
#include "megaton/kernels/cuda/elementwise.cuh"
#include "megaton/kernels/ignore_index.h"

namespace megaton::kernels::cuda {

namespace {

constexpr int kRowThreads = 256;  // threads per row (a power of two: the reduction tree halves it)

// Running (max, sum of exp(x - max)) of a set of values; merging two is exact up to rounding.
// sum == 0 exactly when nothing finite was seen (sum >= 1 once max is finite); a NaN logit makes
// sum NaN, and NaN survives every merge, so the row's loss is NaN.
struct MaxSum {
  float max, sum;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  if (a.sum == 0.0f) return b;  // an empty side (also keeps -inf - -inf = NaN out)
  if (b.sum == 0.0f) return a;
  const float m = fmaxf(a.max, b.max);
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// forward: per thread an online (max, sum) over a strided slice of the row, then a fixed tree over
// the block; lse = max + log(sum), loss = lse - x[target].
template <typename T>
__global__ void cross_entropy_forward_kernel(float* loss, float* lse, const T* logits, const int32_t* targets,
                                             int64_t V) {
  __shared__ float smax[kRowThreads], ssum[kRowThreads];
  const int64_t row = blockIdx.x;
  const int32_t target = targets[row];
  if (target == kIgnoreIndex) {  // uniform over the block: every thread returns together
    if (threadIdx.x == 0) {
      loss[row] = 0.0f;
      lse[row] = 0.0f;
    }
    return;
  }
  const T* x = logits + row * V;
  MaxSum acc{-INFINITY, 0.0f};
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float xv = detail::load(x, v);
    if (xv > acc.max) {
      acc.sum = acc.sum * expf(acc.max - xv) + 1.0f;  // expf(-inf) = 0 for the first element
      acc.max = xv;
    } else {
      acc.sum += xv == -INFINITY ? 0.0f : expf(xv - acc.max);  // -inf adds nothing (even while max is -inf)
    }
  }
  smax[threadIdx.x] = acc.max;
  ssum[threadIdx.x] = acc.sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const MaxSum m = merge({smax[threadIdx.x], ssum[threadIdx.x]}, {smax[threadIdx.x + s], ssum[threadIdx.x + s]});
      smax[threadIdx.x] = m.max;
      ssum[threadIdx.x] = m.sum;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const float row_lse = smax[0] + logf(ssum[0]);
    lse[row] = row_lse;
    // The caller checked targets are in [0, V); out of range anyway: NaN rather than a stray read.
    loss[row] = (target >= 0 && target < V) ? row_lse - detail::load(x, target) : NAN;
  }
}

// backward: dx = grad_scale * (exp(x - lse) - onehot), 0 on ignored rows. Each element is read
// and then written by the same thread, so dlogits may alias logits.
template <typename T>
__global__ void cross_entropy_backward_kernel(T* dlogits, const T* logits, const float* lse, const int32_t* targets,
                                              float grad_scale, int64_t V) {
  const int64_t row = blockIdx.x;
  const int32_t target = targets[row];
  T* dx = dlogits + row * V;
  const T* x = logits + row * V;
  if (target == kIgnoreIndex) {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) detail::store(dx, v, 0.0f);
    return;
  }
  const float row_lse = lse[row];
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float p = expf(detail::load(x, v) - row_lse);
    detail::store(dx, v, grad_scale * (v == target ? p - 1.0f : p));
  }
}

}  // namespace

void cross_entropy_forward(const ExecContext& ctx, const Tensor& loss, const Tensor& lse, const Tensor& logits,
                           const Tensor& targets, int64_t N, int64_t V) {
  constexpr std::string_view op = "cross_entropy_forward";
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  expect_dtype(DType::F32, op, {&loss, &lse});
  if (N == 0) return;
  if (N > 0x7fffffff) fail("kernel ", op, " on cuda: ", N, " rows exceed the grid limit");
  detail::dispatch_io(op, logits, {}, [&]<typename T>(T) {
    cross_entropy_forward_kernel<<<static_cast<unsigned>(N), kRowThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<float*>(loss.raw()), static_cast<float*>(lse.raw()), static_cast<const T*>(logits.raw()),
        static_cast<const int32_t*>(targets.raw()), V);
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

void cross_entropy_backward(const ExecContext& ctx, const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                            const Tensor& targets, double grad_scale, int64_t N, int64_t V) {
  constexpr std::string_view op = "cross_entropy_backward";
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  expect_dtype(DType::F32, op, {&lse});
  if (N == 0) return;
  if (N > 0x7fffffff) fail("kernel ", op, " on cuda: ", N, " rows exceed the grid limit");
  detail::dispatch_io(op, logits, {&dlogits}, [&]<typename T>(T) {
    cross_entropy_backward_kernel<<<static_cast<unsigned>(N), kRowThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<T*>(dlogits.raw()), static_cast<const T*>(logits.raw()), static_cast<const float*>(lse.raw()),
        static_cast<const int32_t*>(targets.raw()), static_cast<float>(grad_scale), V);
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

}  // namespace megaton::kernels::cuda
