#include <cmath>

#include "megaton/kernels/cuda/cross_entropy.h"
#include "megaton/kernels/cuda/elementwise.cuh"
#include "megaton/kernels/ignore_index.h"

namespace megaton::kernels::cuda {

namespace {

constexpr int kRowThreads = 256;  // threads per row (a power of two: the reduction tree halves it)

struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// Fixed-order tree over the block's per-thread values; every thread returns the result.
template <typename Op>
__device__ float block_reduce(float v, Op op) {
  __shared__ float s[kRowThreads];
  s[threadIdx.x] = v;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half) s[threadIdx.x] = op(s[threadIdx.x], s[threadIdx.x + half]);
    __syncthreads();
  }
  const float r = s[0];
  __syncthreads();  // s is reused by the next reduction of the same block
  return r;
}

template <typename T>
__global__ void row_max_kernel(float* row_max, const T* logits, int64_t V) {
  const T* x = logits + static_cast<int64_t>(blockIdx.x) * V;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, detail::load(x, v));
  m = block_reduce(m, Max{});
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

// sum_v exp(x - max) and x[target - vocab_start] where the target lies in this shard. A NaN logit
// makes the sum NaN (fmaxf skipped it in the max), so the loss is NaN.
template <typename T>
__global__ void sum_exp_kernel(float* sum_exp, float* target_logit, const T* logits, const float* row_max,
                               const int32_t* targets, int64_t vocab_start, int64_t V) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * V;
  const float m = row_max[row];
  float s = 0.0f;
  if (m != -INFINITY)  // an all -inf shard adds nothing (and -inf - -inf would be NaN)
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) s += expf(detail::load(x, v) - m);
  s = block_reduce(s, Sum{});
  if (threadIdx.x == 0) {
    sum_exp[row] = s;
    const int64_t local = static_cast<int64_t>(targets[row]) - vocab_start;
    target_logit[row] = targets[row] != kIgnoreIndex && local >= 0 && local < V ? detail::load(x, local) : 0.0f;
  }
}

__global__ void loss_kernel(float* loss, float* lse, const float* row_max, const float* sum_exp,
                            const float* target_logit, const int32_t* targets, int64_t N) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const bool ignored = targets[n] == kIgnoreIndex;
  const float l = row_max[n] + logf(sum_exp[n]);
  lse[n] = ignored ? 0.0f : l;
  loss[n] = ignored ? 0.0f : l - target_logit[n];
}

// dx = grad_scale * (exp(x - lse) - onehot), 0 on ignored rows. Each element is read and then
// written by the same thread, so dlogits may alias logits.
template <typename T>
__global__ void backward_kernel(T* dlogits, const T* logits, const float* lse, const int32_t* targets,
                                int64_t vocab_start, float grad_scale, int64_t V) {
  const int64_t row = blockIdx.x;
  T* dx = dlogits + row * V;
  const T* x = logits + row * V;
  if (targets[row] == kIgnoreIndex) {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) detail::store(dx, v, 0.0f);
    return;
  }
  const int64_t target = static_cast<int64_t>(targets[row]) - vocab_start;  // outside [0, V): another shard's
  const float row_lse = lse[row];
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float p = expf(detail::load(x, v) - row_lse);
    detail::store(dx, v, grad_scale * (v == target ? p - 1.0f : p));
  }
}

// One block per row: N must fit the grid.
unsigned row_blocks(std::string_view op, int64_t N) {
  if (N > 0x7fffffff) fail("kernel ", op, " on cuda: ", N, " rows exceed the grid limit");
  return static_cast<unsigned>(N);
}

float* f32(const Tensor& t) { return static_cast<float*>(t.raw()); }
const int32_t* i32(const Tensor& t) { return static_cast<const int32_t*>(t.raw()); }

}  // namespace

void cross_entropy_row_max(const ExecContext& ctx, const Tensor& row_max, const Tensor& logits, int64_t N, int64_t V) {
  constexpr std::string_view op = "cross_entropy_row_max";
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  if (N == 0) return;
  detail::dispatch_io(op, logits, {}, [&]<typename T>(T) {
    row_max_kernel<<<row_blocks(op, N), kRowThreads, 0, detail::stream_of(ctx)>>>(
        f32(row_max), static_cast<const T*>(logits.raw()), V);
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

void cross_entropy_sum_exp(const ExecContext& ctx, const Tensor& sum_exp, const Tensor& target_logit,
                           const Tensor& logits, const Tensor& row_max, const Tensor& targets, int64_t vocab_start,
                           int64_t N, int64_t V) {
  constexpr std::string_view op = "cross_entropy_sum_exp";
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  if (N == 0) return;
  detail::dispatch_io(op, logits, {}, [&]<typename T>(T) {
    sum_exp_kernel<<<row_blocks(op, N), kRowThreads, 0, detail::stream_of(ctx)>>>(
        f32(sum_exp), f32(target_logit), static_cast<const T*>(logits.raw()), f32(row_max), i32(targets), vocab_start,
        V);
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

void cross_entropy_loss(const ExecContext& ctx, const Tensor& loss, const Tensor& lse, const Tensor& row_max,
                        const Tensor& sum_exp, const Tensor& target_logit, const Tensor& targets, int64_t N) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  if (N == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (N + kThreads - 1) / kThreads;
  loss_kernel<<<row_blocks("cross_entropy_loss", blocks), kThreads, 0, detail::stream_of(ctx)>>>(
      f32(loss), f32(lse), f32(row_max), f32(sum_exp), f32(target_logit), i32(targets), N);
  MEGATON_CUDA_LAUNCH_CHECK();
}

void cross_entropy_backward(const ExecContext& ctx, const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                            const Tensor& targets, int64_t vocab_start, double grad_scale, int64_t N, int64_t V) {
  constexpr std::string_view op = "cross_entropy_backward";
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  if (N == 0) return;
  detail::dispatch_io(op, logits, {&dlogits}, [&]<typename T>(T) {
    backward_kernel<<<row_blocks(op, N), kRowThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<T*>(dlogits.raw()), static_cast<const T*>(logits.raw()), f32(lse), i32(targets), vocab_start,
        static_cast<float>(grad_scale), V);
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

}  // namespace megaton::kernels::cuda
