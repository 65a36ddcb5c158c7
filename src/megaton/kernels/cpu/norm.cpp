#include "megaton/kernels/cpu/norm.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <type_traits>
#include <vector>

#include "megaton/kernels/cpu/element.h"
#include "megaton/kernels/cpu/parallel_min.h"

namespace megaton::kernels::cpu {

namespace {

// Rows per partial sum in the weight-gradient reductions. Fixed (not derived from the thread
// count) so that the summation order, and hence every bit of the result, is thread-count free.
constexpr int64_t kRowChunk = 128;

// Row statistics are accumulated in double: float sums over thousands of channels lose digits, and
// the variance is taken about the mean (two passes) to avoid cancellation when |mean| >> std.
template <typename T>
double row_mean(const T* x, int64_t C) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < C; ++c) s += static_cast<double>(load(x[c]));
  return s / static_cast<double>(C);
}

// mean((x - center)^2): the variance for center = mean, the mean square for center = 0.
template <typename T>
double row_mean_square(const T* x, double center, int64_t C) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < C; ++c) {
    const double d = static_cast<double>(load(x[c])) - center;
    s += d * d;
  }
  return s / static_cast<double>(C);
}

// out[c - c0] = (x - mean) * rstd * weight (+ bias) for columns [c0, c1). RMSNorm is the case
// mean = 0, no bias. TO = T for the written output; float for the FP8 producer, which takes the
// same values before their rounding to T.
template <typename TO, typename T, typename W>
void normalize_row(TO* __restrict out, const T* __restrict x, const W* __restrict weight, const W* __restrict bias,
                   compute_t<T> mean, compute_t<T> rstd, int64_t c0, int64_t c1) {
  if (bias) {
#pragma omp simd
    for (int64_t c = c0; c < c1; ++c)
      out[c - c0] = store<TO>((load(x[c]) - mean) * rstd * load(weight[c]) + load(bias[c]));
  } else {
#pragma omp simd
    for (int64_t c = c0; c < c1; ++c) out[c - c0] = store<TO>((load(x[c]) - mean) * rstd * load(weight[c]));
  }
}

// Input gradient of one row of y = xhat * weight (+ bias), xhat = (x - mean) * rstd. With
// g = dout * weight: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)). For RMSNorm (mean = 0,
// centered = false) the statistics do not depend on mean(x), so the mean(g) term drops out.
// dres (may be null): the residual stream's gradient, added before dx is stored.
template <typename T, typename W>
void norm_backward_row(T* __restrict dx, const T* __restrict dout, const T* __restrict x, const W* __restrict weight,
                       const T* __restrict dres, compute_t<T> mean, compute_t<T> rstd, int64_t C, bool centered) {
  using S = compute_t<T>;
  double sum_g = 0.0, sum_gx = 0.0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
  for (int64_t c = 0; c < C; ++c) {
    const double g = static_cast<double>(load(dout[c]) * load(weight[c]));
    sum_g += g;
    sum_gx += g * static_cast<double>((load(x[c]) - mean) * rstd);
  }
  const S mean_g = centered ? static_cast<S>(sum_g / static_cast<double>(C)) : S(0);
  const S mean_gx = static_cast<S>(sum_gx / static_cast<double>(C));
  // The residual branch is chosen outside the loop: adding a zero would turn -0 into +0.
  auto write = [&](auto with_residual) {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      const S xhat = (load(x[c]) - mean) * rstd;
      S g = rstd * (load(dout[c]) * load(weight[c]) - mean_g - xhat * mean_gx);
      if constexpr (decltype(with_residual)::value) g += load(dres[c]);
      dx[c] = store<T>(g);
    }
  };
  if (dres)
    write(std::true_type{});
  else
    write(std::false_type{});
}

// Column sums over N rows: add_row(n, acc) adds row n's contribution to acc[0, width). Rows are
// split into fixed kRowChunk chunks with one double partial each, then partials are summed in
// chunk order, so the result does not depend on the thread count.
template <typename AddRow>
std::vector<double> column_sums(int64_t N, int64_t width, AddRow add_row) {
  const int64_t chunks = (N + kRowChunk - 1) / kRowChunk;
  // Uninitialised on purpose: each chunk zeroes its own partial inside the parallel loop.
  std::unique_ptr<double[]> partials(new double[chunks * width]);
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < chunks; ++k) {
    double* acc = partials.get() + k * width;
    std::fill(acc, acc + width, 0.0);
    for (int64_t n = k * kRowChunk; n < std::min(N, (k + 1) * kRowChunk); ++n) add_row(n, acc);
  }
  std::vector<double> total(width);
#pragma omp parallel for simd schedule(static)
  for (int64_t c = 0; c < width; ++c) {
    double s = 0.0;
    for (int64_t k = 0; k < chunks; ++k) s += partials[k * width + c];
    total[c] = s;
  }
  return total;
}

// dweight += sum_n dout * xhat, and dbias += sum_n dout when dbias is given.
template <typename T, typename W>
void norm_backward_weight(W* dweight, W* dbias, const T* dout, const T* x, const compute_t<T>* mean,
                          const compute_t<T>* rstd, int64_t N, int64_t C) {
  using S = compute_t<T>;
  using SW = compute_t<W>;
  const int64_t width = dbias ? 2 * C : C;
  const std::vector<double> sums = column_sums(N, width, [&](int64_t n, double* __restrict acc) {
    const T* d = dout + n * C;
    const T* xr = x + n * C;
    const S m = mean ? mean[n] : S(0);
    const S r = rstd[n];
#pragma omp simd
    for (int64_t c = 0; c < C; ++c)
      acc[c] += static_cast<double>(load(d[c])) * static_cast<double>((load(xr[c]) - m) * r);
    if (dbias) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) acc[C + c] += static_cast<double>(load(d[c]));
    }
  });
  for (int64_t c = 0; c < C; ++c) dweight[c] = store<W>(load(dweight[c]) + static_cast<SW>(sums[c]));
  if (dbias)
    for (int64_t c = 0; c < C; ++c) dbias[c] = store<W>(load(dbias[c]) + static_cast<SW>(sums[C + c]));
}

// rstd is rounded to the statistics type S before use so that forward and backward see exactly the
// same value.
template <typename S>
S inverse_std(double mean_square, double eps) {
  return static_cast<S>(1.0 / std::sqrt(mean_square + eps));
}

// One pass per row: sum = x + residual first when residual is given (sum may alias x or residual:
// each element is read before it is written), then the statistics and out = norm of that row while
// it is in cache. mean == nullptr is RMSNorm (no centering, no bias); out == nullptr stops at the
// statistics (the fused FP8 forms produce the output later, in f32, for the quantiser).
template <typename T, typename W>
void norm_forward(T* sum, T* out, compute_t<T>* mean, compute_t<T>* rstd, const T* x, const T* residual,
                  const W* weight, const W* bias, int64_t N, int64_t C, double eps) {
  using S = compute_t<T>;
  parallel_for(N, N > 1 ? N * C : 0, [&](int64_t n) {
    const T* xr = x + n * C;
    if (residual) {
      T* s = sum + n * C;
      const T* r = residual + n * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) s[c] = store<T>(load(xr[c]) + load(r[c]));
      xr = s;
    }
    const double m = mean ? row_mean(xr, C) : 0.0;
    if (mean) mean[n] = static_cast<S>(m);
    rstd[n] = inverse_std<S>(row_mean_square(xr, m, C), eps);
    if (out) normalize_row(out + n * C, xr, weight, bias, mean ? mean[n] : S(0), rstd[n], 0, C);
  });
}

}  // namespace

template <typename T, typename W>
void layernorm_forward(T* out, compute_t<T>* mean, compute_t<T>* rstd, const T* x, const W* weight, const W* bias,
                       int64_t N, int64_t C, double eps) {
  norm_forward(static_cast<T*>(nullptr), out, mean, rstd, x, static_cast<const T*>(nullptr), weight, bias, N, C, eps);
}

template <typename T, typename W>
void add_layernorm_forward(T* sum, T* out, compute_t<T>* mean, compute_t<T>* rstd, const T* x, const T* residual,
                           const W* weight, const W* bias, int64_t N, int64_t C, double eps) {
  norm_forward(sum, out, mean, rstd, x, residual, weight, bias, N, C, eps);
}

template <typename T>
void norm_statistics(T* sum, compute_t<T>* mean, compute_t<T>* rstd, const T* x, const T* residual, int64_t N,
                     int64_t C, double eps) {
  norm_forward(sum, static_cast<T*>(nullptr), mean, rstd, x, residual, static_cast<const float*>(nullptr),
               static_cast<const float*>(nullptr), N, C, eps);
}

template <typename T, typename W>
void normalize_block_f32(float* out, int64_t ld, const T* x, const compute_t<T>* mean, const compute_t<T>* rstd,
                         const W* weight, const W* bias, int64_t C, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  using S = compute_t<T>;
  for (int64_t n = r0; n < r1; ++n)
    normalize_row(out + (n - r0) * ld, x + n * C, weight, bias, mean ? mean[n] : S(0), rstd[n], c0, c1);
}

template <typename T, typename W>
void layernorm_backward_input(T* dx, const T* dout, const T* x, const W* weight, const compute_t<T>* mean,
                              const compute_t<T>* rstd, int64_t N, int64_t C, const T* dresidual) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    norm_backward_row(dx + n * C, dout + n * C, x + n * C, weight, dresidual ? dresidual + n * C : nullptr, mean[n],
                      rstd[n], C, /*centered=*/true);
}

template <typename T, typename W>
void layernorm_backward_weight(W* dweight, W* dbias, const T* dout, const T* x, const compute_t<T>* mean,
                               const compute_t<T>* rstd, int64_t N, int64_t C) {
  norm_backward_weight(dweight, dbias, dout, x, mean, rstd, N, C);
}

template <typename T, typename W>
void rmsnorm_forward(T* out, compute_t<T>* rstd, const T* x, const W* weight, int64_t N, int64_t C, double eps) {
  norm_forward(static_cast<T*>(nullptr), out, static_cast<compute_t<T>*>(nullptr), rstd, x,
               static_cast<const T*>(nullptr), weight, static_cast<const W*>(nullptr), N, C, eps);
}

template <typename T, typename W>
void add_rmsnorm_forward(T* sum, T* out, compute_t<T>* rstd, const T* x, const T* residual, const W* weight, int64_t N,
                         int64_t C, double eps) {
  norm_forward(sum, out, static_cast<compute_t<T>*>(nullptr), rstd, x, residual, weight,
               static_cast<const W*>(nullptr), N, C, eps);
}

template <typename T, typename W>
void rmsnorm_backward_input(T* dx, const T* dout, const T* x, const W* weight, const compute_t<T>* rstd, int64_t N,
                            int64_t C, const T* dresidual) {
  using S = compute_t<T>;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    norm_backward_row(dx + n * C, dout + n * C, x + n * C, weight, dresidual ? dresidual + n * C : nullptr, S(0),
                      rstd[n], C, /*centered=*/false);
}

template <typename T, typename W>
void rmsnorm_backward_weight(W* dweight, const T* dout, const T* x, const compute_t<T>* rstd, int64_t N, int64_t C) {
  norm_backward_weight(dweight, static_cast<W*>(nullptr), dout, x, static_cast<const compute_t<T>*>(nullptr), rstd,
                       N, C);
}

// Activations T with parameters (weight, bias and their gradients) W: f32 and f64 alone, bf16
// activations with an fp32 or a bf16 copy of the parameters.
#define MEGATON_INSTANTIATE(T, W)                                                                            \
  template void layernorm_forward<T, W>(T*, compute_t<T>*, compute_t<T>*, const T*, const W*, const W*, int64_t, \
                                        int64_t, double);                                                    \
  template void add_layernorm_forward<T, W>(T*, T*, compute_t<T>*, compute_t<T>*, const T*, const T*, const W*,  \
                                            const W*, int64_t, int64_t, double);                               \
  template void layernorm_backward_input<T, W>(T*, const T*, const T*, const W*, const compute_t<T>*,          \
                                               const compute_t<T>*, int64_t, int64_t, const T*);               \
  template void layernorm_backward_weight<T, W>(W*, W*, const T*, const T*, const compute_t<T>*,               \
                                                const compute_t<T>*, int64_t, int64_t);                        \
  template void rmsnorm_forward<T, W>(T*, compute_t<T>*, const T*, const W*, int64_t, int64_t, double);        \
  template void add_rmsnorm_forward<T, W>(T*, T*, compute_t<T>*, const T*, const T*, const W*, int64_t, int64_t, \
                                          double);                                                             \
  template void rmsnorm_backward_input<T, W>(T*, const T*, const T*, const W*, const compute_t<T>*, int64_t,   \
                                             int64_t, const T*);                                               \
  template void rmsnorm_backward_weight<T, W>(W*, const T*, const T*, const compute_t<T>*, int64_t, int64_t);
MEGATON_INSTANTIATE(float, float)
MEGATON_INSTANTIATE(double, double)
MEGATON_INSTANTIATE(BFloat16, float)
MEGATON_INSTANTIATE(BFloat16, BFloat16)
MEGATON_INSTANTIATE(Float16, float)
MEGATON_INSTANTIATE(Float16, Float16)
#undef MEGATON_INSTANTIATE
template void norm_statistics<float>(float*, float*, float*, const float*, const float*, int64_t, int64_t, double);
template void norm_statistics<BFloat16>(BFloat16*, float*, float*, const BFloat16*, const BFloat16*, int64_t, int64_t,
                                        double);
template void normalize_block_f32<float, float>(float*, int64_t, const float*, const float*, const float*, const float*,
                                                const float*, int64_t, int64_t, int64_t, int64_t, int64_t);
template void normalize_block_f32<BFloat16, float>(float*, int64_t, const BFloat16*, const float*, const float*,
                                                   const float*, const float*, int64_t, int64_t, int64_t, int64_t,
                                                   int64_t);
template void normalize_block_f32<BFloat16, BFloat16>(float*, int64_t, const BFloat16*, const float*, const float*,
                                                      const BFloat16*, const BFloat16*, int64_t, int64_t, int64_t,
                                                      int64_t, int64_t);

}  // namespace megaton::kernels::cpu
