#include "megaton/kernels/cuda/norm.h"
#include "megaton/kernels/cuda/elementwise.cuh"

namespace megaton::kernels::cuda {

namespace {

constexpr int kRowThreads = 256;  // threads per row in the per-row kernels (a power of two)
constexpr int kColThreads = 256;  // columns per block in the column-sum kernels

// Sum of v over the block, the same tree every time (deterministic); every thread gets the result.
__device__ float block_sum(float v, float* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  const float total = shared[0];
  __syncthreads();
  return total;
}

template <typename T, typename W>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* x, const W* w, int64_t C, float eps) {
  __shared__ float shared[kRowThreads];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * C;
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = detail::load(xr, c);
    ss += v * v;
  }
  const float r = rsqrtf(block_sum(ss, shared) / static_cast<float>(C) + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    detail::store(out + row * C, c, detail::load(xr, c) * r * detail::load(w, c));
}

// dx = r (g - xhat mean(g xhat)), g = dout * w, xhat = x r.
template <typename T, typename W>
__global__ void rmsnorm_backward_input_kernel(T* dx, const T* dout, const T* x, const W* w, const float* rstd,
                                              int64_t C) {
  __shared__ float shared[kRowThreads];
  const int64_t row = blockIdx.x;
  const float r = rstd[row];
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    dot += detail::load(dout + row * C, c) * detail::load(w, c) * detail::load(x + row * C, c) * r;
  const float mean_gx = block_sum(dot, shared) / static_cast<float>(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = detail::load(dout + row * C, c) * detail::load(w, c);
    const float xhat = detail::load(x + row * C, c) * r;
    detail::store(dx + row * C, c, r * (g - xhat * mean_gx));
  }
}

// One thread per column sums over every row in order: deterministic and independent of the grid.
template <typename T, typename W>
__global__ void rmsnorm_backward_weight_kernel(W* dw, const T* dout, const T* x, const float* rstd, int64_t N,
                                               int64_t C) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int64_t n = 0; n < N; ++n) acc += detail::load(dout + n * C, c) * detail::load(x + n * C, c) * rstd[n];
  detail::store(dw, c, detail::load(dw, c) + acc);
}

unsigned column_blocks(int64_t C) { return static_cast<unsigned>((C + kColThreads - 1) / kColThreads); }

// Calls f(T{}, W{}) for the activation dtype of `act` and the weight dtype of `weight`.
template <typename F>
void dispatch_act_weight(std::string_view op, const Tensor& act, std::initializer_list<const Tensor*> acts,
                         const Tensor& weight, F&& f) {
  detail::dispatch_io(op, act, acts, [&]<typename T>(T) {
    detail::dispatch_io(op, weight, {}, [&]<typename W>(W) { f(T{}, W{}); });
  });
}

}  // namespace

void rmsnorm_forward(const ExecContext& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x,
                     const Tensor& weight, double eps, int64_t N, int64_t C) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  expect_dtype(DType::F32, "rmsnorm_forward", {&rstd});
  if (N == 0) return;
  dispatch_act_weight("rmsnorm_forward", x, {&out}, weight, [&]<typename T, typename W>(T, W) {
    rmsnorm_forward_kernel<<<static_cast<unsigned>(N), kRowThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<T*>(out.raw()), static_cast<float*>(rstd.raw()), static_cast<const T*>(x.raw()),
        static_cast<const W*>(weight.raw()), C, static_cast<float>(eps));
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

void rmsnorm_backward_input(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x,
                            const Tensor& weight, const Tensor& rstd, int64_t N, int64_t C) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  expect_dtype(DType::F32, "rmsnorm_backward_input", {&rstd});
  if (N == 0) return;
  dispatch_act_weight("rmsnorm_backward_input", x, {&dx, &dout}, weight, [&]<typename T, typename W>(T, W) {
    rmsnorm_backward_input_kernel<<<static_cast<unsigned>(N), kRowThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<T*>(dx.raw()), static_cast<const T*>(dout.raw()), static_cast<const T*>(x.raw()),
        static_cast<const W*>(weight.raw()), static_cast<const float*>(rstd.raw()), C);
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

void rmsnorm_backward_weight(const ExecContext& ctx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                             const Tensor& rstd, int64_t N, int64_t C) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  expect_dtype(DType::F32, "rmsnorm_backward_weight", {&rstd});
  dispatch_act_weight("rmsnorm_backward_weight", x, {&dout}, dweight, [&]<typename T, typename W>(T, W) {
    rmsnorm_backward_weight_kernel<<<column_blocks(C), kColThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<W*>(dweight.raw()), static_cast<const T*>(dout.raw()), static_cast<const T*>(x.raw()),
        static_cast<const float*>(rstd.raw()), N, C);
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

}  // namespace megaton::kernels::cuda
