#include "megaton/kernels/cuda/norm.h"

#include <vector>

#include "megaton/kernels/cuda/elementwise.cuh"

namespace megaton::kernels::cuda {

namespace {

constexpr int kRowThreads = 256;  // threads per row in the per-row kernels (a power of two)
constexpr int kColThreads = 256;  // columns per block in the column-sum kernel

// One block per row. residual != nullptr: sum = x + residual is written first and normalised; every
// thread reads back only the columns it wrote (after reading them), so sum may alias x or residual.
// mean == nullptr: RMSNorm.
template <typename T, typename W>
__global__ void norm_forward_kernel(T* sum, T* out, float* mean, float* rstd, const T* x, const T* residual, const W* w,
                                    const W* bias, int64_t C, float eps) {
  __shared__ float shared[kRowThreads];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * C;
  if (residual) {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      detail::store(sum + row * C, c, detail::load(xr, c) + detail::load(residual + row * C, c));
    xr = sum + row * C;
  }
  float m = 0.0f;
  if (mean) {
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += detail::load(xr, c);
    m = detail::block_sum(s, shared) / static_cast<float>(C);
  }
  float ss = 0.0f;  // about the mean (two passes): no cancellation when |mean| >> std
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = detail::load(xr, c) - m;
    ss += d * d;
  }
  const float r = rsqrtf(detail::block_sum(ss, shared) / static_cast<float>(C) + eps);
  if (threadIdx.x == 0) {
    rstd[row] = r;
    if (mean) mean[row] = m;
  }
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float y = (detail::load(xr, c) - m) * r * detail::load(w, c);
    if (bias) y += detail::load(bias, c);
    detail::store(out + row * C, c, y);
  }
}

// dx = r (g - mean(g) - xhat mean(g xhat)), g = dout * w, xhat = (x - mean) r; RMSNorm (mean ==
// nullptr) has no mean(g) term. dres (may be null) is added before dx is stored.
template <typename T, typename W>
__global__ void norm_backward_input_kernel(T* dx, const T* dout, const T* x, const W* w, const float* mean,
                                           const float* rstd, const T* dres, int64_t C) {
  __shared__ float shared[kRowThreads];
  const int64_t row = blockIdx.x;
  const float r = rstd[row], m = mean ? mean[row] : 0.0f;
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = detail::load(dout + row * C, c) * detail::load(w, c);
    sg += g;
    sgx += g * (detail::load(x + row * C, c) - m) * r;
  }
  const float mean_g = mean ? detail::block_sum(sg, shared) / static_cast<float>(C) : 0.0f;
  const float mean_gx = detail::block_sum(sgx, shared) / static_cast<float>(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = detail::load(dout + row * C, c) * detail::load(w, c);
    const float xhat = (detail::load(x + row * C, c) - m) * r;
    float v = r * (g - mean_g - xhat * mean_gx);
    if (dres) v += detail::load(dres + row * C, c);
    detail::store(dx + row * C, c, v);
  }
}

// One thread per column sums over every row in order: deterministic and independent of the grid.
template <typename T, typename W>
__global__ void norm_backward_weight_kernel(W* dw, W* db, const T* dout, const T* x, const float* mean,
                                            const float* rstd, int64_t N, int64_t C) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f, acc_b = 0.0f;
  for (int64_t n = 0; n < N; ++n) {
    const float d = detail::load(dout + n * C, c);
    acc += d * (detail::load(x + n * C, c) - (mean ? mean[n] : 0.0f)) * rstd[n];
    acc_b += d;
  }
  detail::store(dw, c, detail::load(dw, c) + acc);
  if (db) detail::store(db, c, detail::load(db, c) + acc_b);
}

unsigned column_blocks(int64_t C) { return static_cast<unsigned>((C + kColThreads - 1) / kColThreads); }

// Calls f(T{}, W{}) for the activation dtype of `act` (every tensor in `acts` holds it) and the
// parameter dtype of `weight` (every defined tensor in `params` holds it), after checking that the
// defined statistics are f32.
template <typename F>
void dispatch_norm(std::string_view op, const Tensor& act, std::initializer_list<const Tensor*> acts,
                   const Tensor& weight, std::initializer_list<const Tensor*> params,
                   std::initializer_list<const Tensor*> stats, F&& f) {
  for (const Tensor* s : stats)
    if (s->defined()) expect_dtype(DType::F32, op, {s});
  std::vector<const Tensor*> defined_acts, defined_params;
  for (const Tensor* t : acts)
    if (t->defined()) defined_acts.push_back(t);
  for (const Tensor* t : params)
    if (t->defined()) defined_params.push_back(t);
  detail::dispatch_io(op, act, {}, [&]<typename T>(T) {
    for (const Tensor* t : defined_acts) expect_dtype(act.dtype(), op, {t});
    detail::dispatch_io(op, weight, {}, [&]<typename W>(W) {
      for (const Tensor* t : defined_params) expect_dtype(weight.dtype(), op, {t});
      f(T{}, W{});
    });
  });
}

template <typename T>
T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw()) : nullptr;
}

}  // namespace

void norm_forward(const ExecContext& ctx, const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                  const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias, double eps,
                  int64_t N, int64_t C) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  if (N == 0) return;
  dispatch_norm("norm_forward", x, {&out, &sum, &residual}, weight, {&bias}, {&mean, &rstd},
                [&]<typename T, typename W>(T, W) {
                  norm_forward_kernel<<<static_cast<unsigned>(N), kRowThreads, 0, detail::stream_of(ctx)>>>(
                      ptr_or_null<T>(sum), static_cast<T*>(out.raw()), ptr_or_null<float>(mean),
                      static_cast<float*>(rstd.raw()), static_cast<const T*>(x.raw()), ptr_or_null<const T>(residual),
                      static_cast<const W*>(weight.raw()), ptr_or_null<const W>(bias), C, static_cast<float>(eps));
                });
  MEGATON_CUDA_LAUNCH_CHECK();
}

void norm_backward_input(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x,
                         const Tensor& weight, const Tensor& mean, const Tensor& rstd, const Tensor& dresidual,
                         int64_t N, int64_t C) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  if (N == 0) return;
  dispatch_norm("norm_backward_input", x, {&dx, &dout, &dresidual}, weight, {}, {&mean, &rstd},
                [&]<typename T, typename W>(T, W) {
                  norm_backward_input_kernel<<<static_cast<unsigned>(N), kRowThreads, 0, detail::stream_of(ctx)>>>(
                      static_cast<T*>(dx.raw()), static_cast<const T*>(dout.raw()), static_cast<const T*>(x.raw()),
                      static_cast<const W*>(weight.raw()), ptr_or_null<const float>(mean),
                      static_cast<const float*>(rstd.raw()), ptr_or_null<const T>(dresidual), C);
                });
  MEGATON_CUDA_LAUNCH_CHECK();
}

void norm_backward_weight(const ExecContext& ctx, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                          const Tensor& x, const Tensor& mean, const Tensor& rstd, int64_t N, int64_t C) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  dispatch_norm("norm_backward_weight", x, {&dout}, dweight, {&dbias}, {&mean, &rstd},
                [&]<typename T, typename W>(T, W) {
                  norm_backward_weight_kernel<<<column_blocks(C), kColThreads, 0, detail::stream_of(ctx)>>>(
                      static_cast<W*>(dweight.raw()), ptr_or_null<W>(dbias), static_cast<const T*>(dout.raw()),
                      static_cast<const T*>(x.raw()), ptr_or_null<const float>(mean),
                      static_cast<const float*>(rstd.raw()), N, C);
                });
  MEGATON_CUDA_LAUNCH_CHECK();
}

}  // namespace megaton::kernels::cuda
