#include "megaton/kernels/cuda/activation.h"
#include "megaton/kernels/cuda/elementwise.cuh"

namespace megaton::kernels::cuda {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
constexpr int kThreads = 256;

template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float v = detail::load(x, i);
    const float t = tanhf(kSqrt2OverPi * (v + kCubic * v * v * v));
    detail::store(out, i, 0.5f * v * (1.0f + t));
  }
}

// d/dx [0.5 x (1 + tanh(u))] = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx, du/dx = s (1 + 3 c x^2).
template <typename T>
__global__ void gelu_backward_kernel(T* dx, const T* dout, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float v = detail::load(x, i);
    const float t = tanhf(kSqrt2OverPi * (v + kCubic * v * v * v));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * v * v);
    const float grad = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
    detail::store(dx, i, detail::load(dout, i) * grad);
  }
}

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// Element i of out [N, H] reads gate (row, h) and up (row, H + h) of gu [N, 2H].
template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* gu, int64_t N, int64_t H) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < N * H; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / H, h = i % H;
    const float g = detail::load(gu, row * 2 * H + h), u = detail::load(gu, row * 2 * H + H + h);
    detail::store(out, i, g * sigmoid(g) * u);
  }
}

// d gate = dy u s (1 + g (1 - s)), d up = dy silu(g), s = sigmoid(g).
template <typename T>
__global__ void swiglu_backward_kernel(T* dgu, const T* dout, const T* gu, int64_t N, int64_t H) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < N * H; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / H, h = i % H;
    const float g = detail::load(gu, row * 2 * H + h), u = detail::load(gu, row * 2 * H + H + h);
    const float dy = detail::load(dout, i), s = sigmoid(g);
    detail::store(dgu, row * 2 * H + h, dy * u * s * (1.0f + g * (1.0f - s)));
    detail::store(dgu, row * 2 * H + H + h, dy * g * s);
  }
}

// out may be a or b: each element is read before it is written.
template <typename T>
__global__ void residual_kernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    detail::store(out, i, detail::load(a, i) + detail::load(b, i));
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

}  // namespace

void gelu_forward(const ExecContext& ctx, const Tensor& out, const Tensor& x) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  detail::dispatch_io("gelu_forward", x, {&out}, [&]<typename T>(T) {
    gelu_forward_kernel<<<blocks_for(x.numel()), kThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<T*>(out.raw()), static_cast<const T*>(x.raw()), x.numel());
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

void gelu_backward(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  detail::dispatch_io("gelu_backward", x, {&dx, &dout}, [&]<typename T>(T) {
    gelu_backward_kernel<<<blocks_for(x.numel()), kThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<T*>(dx.raw()), static_cast<const T*>(dout.raw()), static_cast<const T*>(x.raw()), x.numel());
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

void swiglu_forward(const ExecContext& ctx, const Tensor& out, const Tensor& gu, int64_t N, int64_t H) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  detail::dispatch_io("swiglu_forward", gu, {&out}, [&]<typename T>(T) {
    swiglu_forward_kernel<<<blocks_for(N * H), kThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<T*>(out.raw()), static_cast<const T*>(gu.raw()), N, H);
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

void swiglu_backward(const ExecContext& ctx, const Tensor& dgu, const Tensor& dout, const Tensor& gu, int64_t N,
                     int64_t H) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  detail::dispatch_io("swiglu_backward", gu, {&dgu, &dout}, [&]<typename T>(T) {
    swiglu_backward_kernel<<<blocks_for(N * H), kThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<T*>(dgu.raw()), static_cast<const T*>(dout.raw()), static_cast<const T*>(gu.raw()), N, H);
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

void residual_forward(const ExecContext& ctx, const Tensor& out, const Tensor& a, const Tensor& b) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  detail::dispatch_io("residual_forward", a, {&out, &b}, [&]<typename T>(T) {
    residual_kernel<<<blocks_for(a.numel()), kThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<T*>(out.raw()), static_cast<const T*>(a.raw()), static_cast<const T*>(b.raw()), a.numel());
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

}  // namespace megaton::kernels::cuda
