#include "megaton/kernels/cuda/activation.h"
#include "megaton/kernels/cuda/elementwise.cuh"

namespace megaton::kernels::cuda {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
constexpr int kThreads = 256;

// out = gelu(x + bias[i % F]) (bias may be null: then F is irrelevant).
template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* x, const float* bias, int64_t n, int64_t F) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float v = detail::load(x, i) + (bias ? bias[i % F] : 0.0f);
    const float t = tanhf(kSqrt2OverPi * (v + kCubic * v * v * v));
    detail::store(out, i, 0.5f * v * (1.0f + t));
  }
}

// d/dx [0.5 x (1 + tanh(u))] = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx, du/dx = s (1 + 3 c x^2).
__device__ __forceinline__ float gelu_grad(float v) {
  const float t = tanhf(kSqrt2OverPi * (v + kCubic * v * v * v));
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * v * v);
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
}

template <typename T>
__global__ void gelu_backward_kernel(T* dx, const T* dout, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    detail::store(dx, i, detail::load(dout, i) * gelu_grad(detail::load(x, i)));
}

// One thread per column f of h [N, F]: dh = dout * gelu'(h + bias) down the column, and dbias[f] +=
// the sum of the stored dh (as a separate bias gradient would read them), rows in order.
template <typename T>
__global__ void bias_gelu_backward_kernel(T* dh, float* dbias, const T* dout, const T* h, const float* bias, int64_t N,
                                          int64_t F) {
  const int64_t f = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (f >= F) return;
  float acc = 0.0f;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t i = n * F + f;
    detail::store(dh, i, detail::load(dout, i) * gelu_grad(detail::load(h, i) + bias[f]));
    acc += detail::load(dh, i);
  }
  dbias[f] += acc;
}

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// Element i of out [N, H] reads gate (row, h) and up (row, H + h) of gu [N, 2H], + bias[h] and
// bias[H + h] when bias is given.
template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* gu, const float* bias, int64_t N, int64_t H) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < N * H; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / H, h = i % H;
    float g = detail::load(gu, row * 2 * H + h), u = detail::load(gu, row * 2 * H + H + h);
    if (bias) g += bias[h], u += bias[H + h];
    detail::store(out, i, g * sigmoid(g) * u);
  }
}

// d gate = dy u s (1 + g (1 - s)), d up = dy silu(g), s = sigmoid(g), into dgu's row.
template <typename T>
__device__ __forceinline__ void swiglu_grad(T* dgu_row, const T* gu_row, int64_t H, int64_t h, float dy, float gb,
                                            float ub) {
  const float g = detail::load(gu_row, h) + gb, u = detail::load(gu_row, H + h) + ub, s = sigmoid(g);
  detail::store(dgu_row, h, dy * u * s * (1.0f + g * (1.0f - s)));
  detail::store(dgu_row, H + h, dy * g * s);
}

template <typename T>
__global__ void swiglu_backward_kernel(T* dgu, const T* dout, const T* gu, int64_t N, int64_t H) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < N * H; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / H;
    swiglu_grad(dgu + row * 2 * H, gu + row * 2 * H, H, i % H, detail::load(dout, i), 0.0f, 0.0f);
  }
}

// One thread per column h: both halves' gradients down the column, their stored values summed into
// dbias[h] and dbias[H + h], rows in order.
template <typename T>
__global__ void bias_swiglu_backward_kernel(T* dgu, float* dbias, const T* dout, const T* gu, const float* bias,
                                            int64_t N, int64_t H) {
  const int64_t h = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (h >= H) return;
  float acc_gate = 0.0f, acc_up = 0.0f;
  for (int64_t n = 0; n < N; ++n) {
    T* row = dgu + n * 2 * H;
    swiglu_grad(row, gu + n * 2 * H, H, h, detail::load(dout, n * H + h), bias[h], bias[H + h]);
    acc_gate += detail::load(row, h);
    acc_up += detail::load(row, H + h);
  }
  dbias[h] += acc_gate;
  dbias[H + h] += acc_up;
}

// out may be a or b: each element is read before it is written.
template <typename T>
__global__ void residual_kernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    detail::store(out, i, detail::load(a, i) + detail::load(b, i));
}

unsigned column_blocks(int64_t columns) { return static_cast<unsigned>((columns + kThreads - 1) / kThreads); }

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

}  // namespace

void gelu_forward(const ExecContext& ctx, const Tensor& out, const Tensor& x) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  detail::dispatch_io("gelu_forward", x, {&out}, [&]<typename T>(T) {
    gelu_forward_kernel<<<blocks_for(x.numel()), kThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<T*>(out.raw()), static_cast<const T*>(x.raw()), nullptr, x.numel(), 1);
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
        static_cast<T*>(out.raw()), static_cast<const T*>(gu.raw()), nullptr, N, H);
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

void bias_gelu_forward(const ExecContext& ctx, const Tensor& out, const Tensor& h, const Tensor& bias, int64_t F) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  detail::dispatch_io("bias_gelu_forward", h, {&out}, [&]<typename T>(T) {
    gelu_forward_kernel<<<blocks_for(h.numel()), kThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<T*>(out.raw()), static_cast<const T*>(h.raw()), static_cast<const float*>(bias.raw()), h.numel(),
        F);
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

void bias_gelu_backward(const ExecContext& ctx, const Tensor& dh, const Tensor& dbias, const Tensor& dout,
                        const Tensor& h, const Tensor& bias, int64_t F) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  detail::dispatch_io("bias_gelu_backward", h, {&dh, &dout}, [&]<typename T>(T) {
    bias_gelu_backward_kernel<<<column_blocks(F), kThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<T*>(dh.raw()), static_cast<float*>(dbias.raw()), static_cast<const T*>(dout.raw()),
        static_cast<const T*>(h.raw()), static_cast<const float*>(bias.raw()), h.numel() / F, F);
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

void bias_swiglu_forward(const ExecContext& ctx, const Tensor& out, const Tensor& gu, const Tensor& bias, int64_t N,
                         int64_t H) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  detail::dispatch_io("bias_swiglu_forward", gu, {&out}, [&]<typename T>(T) {
    swiglu_forward_kernel<<<blocks_for(N * H), kThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<T*>(out.raw()), static_cast<const T*>(gu.raw()), static_cast<const float*>(bias.raw()), N, H);
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

void bias_swiglu_backward(const ExecContext& ctx, const Tensor& dgu, const Tensor& dbias, const Tensor& dout,
                          const Tensor& gu, const Tensor& bias, int64_t N, int64_t H) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  detail::dispatch_io("bias_swiglu_backward", gu, {&dgu, &dout}, [&]<typename T>(T) {
    bias_swiglu_backward_kernel<<<column_blocks(H), kThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<T*>(dgu.raw()), static_cast<float*>(dbias.raw()), static_cast<const T*>(dout.raw()),
        static_cast<const T*>(gu.raw()), static_cast<const float*>(bias.raw()), N, H);
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
