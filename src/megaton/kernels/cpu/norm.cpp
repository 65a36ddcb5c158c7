#include "megaton/kernels/cpu/norm.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

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
  for (int64_t c = 0; c < C; ++c) s += static_cast<double>(x[c]);
  return s / static_cast<double>(C);
}

// mean((x - center)^2): the variance for center = mean, the mean square for center = 0.
template <typename T>
double row_mean_square(const T* x, double center, int64_t C) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < C; ++c) {
    const double d = static_cast<double>(x[c]) - center;
    s += d * d;
  }
  return s / static_cast<double>(C);
}

// out = (x - mean) * rstd * weight (+ bias). RMSNorm is the case mean = 0, no bias.
template <typename T>
void normalize_row(T* __restrict out, const T* __restrict x, const T* __restrict weight, const T* __restrict bias,
                   T mean, T rstd, int64_t C) {
  if (bias) {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) out[c] = (x[c] - mean) * rstd * weight[c] + bias[c];
  } else {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) out[c] = (x[c] - mean) * rstd * weight[c];
  }
}

// Input gradient of one row of y = xhat * weight (+ bias), xhat = (x - mean) * rstd. With
// g = dout * weight: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)). For RMSNorm (mean = 0,
// centered = false) the statistics do not depend on mean(x), so the mean(g) term drops out.
template <typename T>
void norm_backward_row(T* __restrict dx, const T* __restrict dout, const T* __restrict x, const T* __restrict weight,
                       T mean, T rstd, int64_t C, bool centered) {
  double sum_g = 0.0, sum_gx = 0.0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
  for (int64_t c = 0; c < C; ++c) {
    const double g = static_cast<double>(dout[c] * weight[c]);
    sum_g += g;
    sum_gx += g * static_cast<double>((x[c] - mean) * rstd);
  }
  const T mean_g = centered ? static_cast<T>(sum_g / static_cast<double>(C)) : T(0);
  const T mean_gx = static_cast<T>(sum_gx / static_cast<double>(C));
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) {
    const T xhat = (x[c] - mean) * rstd;
    dx[c] = rstd * (dout[c] * weight[c] - mean_g - xhat * mean_gx);
  }
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
template <typename T>
void norm_backward_weight(T* dweight, T* dbias, const T* dout, const T* x, const T* mean, const T* rstd, int64_t N,
                          int64_t C) {
  const int64_t width = dbias ? 2 * C : C;
  const std::vector<double> sums = column_sums(N, width, [&](int64_t n, double* __restrict acc) {
    const T* d = dout + n * C;
    const T* xr = x + n * C;
    const T m = mean ? mean[n] : T(0);
    const T r = rstd[n];
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) acc[c] += static_cast<double>(d[c]) * static_cast<double>((xr[c] - m) * r);
    if (dbias) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) acc[C + c] += static_cast<double>(d[c]);
    }
  });
  for (int64_t c = 0; c < C; ++c) dweight[c] += static_cast<T>(sums[c]);
  if (dbias)
    for (int64_t c = 0; c < C; ++c) dbias[c] += static_cast<T>(sums[C + c]);
}

// rstd is rounded to T before use so that forward and backward see exactly the same value.
template <typename T>
T inverse_std(double mean_square, double eps) {
  return static_cast<T>(1.0 / std::sqrt(mean_square + eps));
}

}  // namespace

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* weight, const T* bias, int64_t N, int64_t C,
                       double eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    const double m = row_mean(xr, C);
    mean[n] = static_cast<T>(m);
    rstd[n] = inverse_std<T>(row_mean_square(xr, m, C), eps);
    normalize_row(out + n * C, xr, weight, bias, mean[n], rstd[n], C);
  }
}

template <typename T>
void layernorm_backward_input(T* dx, const T* dout, const T* x, const T* weight, const T* mean, const T* rstd,
                              int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    norm_backward_row(dx + n * C, dout + n * C, x + n * C, weight, mean[n], rstd[n], C, /*centered=*/true);
}

template <typename T>
void layernorm_backward_weight(T* dweight, T* dbias, const T* dout, const T* x, const T* mean, const T* rstd, int64_t N,
                               int64_t C) {
  norm_backward_weight(dweight, dbias, dout, x, mean, rstd, N, C);
}

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* weight, int64_t N, int64_t C, double eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    rstd[n] = inverse_std<T>(row_mean_square(xr, 0.0, C), eps);
    normalize_row(out + n * C, xr, weight, static_cast<const T*>(nullptr), T(0), rstd[n], C);
  }
}

template <typename T>
void rmsnorm_backward_input(T* dx, const T* dout, const T* x, const T* weight, const T* rstd, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    norm_backward_row(dx + n * C, dout + n * C, x + n * C, weight, T(0), rstd[n], C, /*centered=*/false);
}

template <typename T>
void rmsnorm_backward_weight(T* dweight, const T* dout, const T* x, const T* rstd, int64_t N, int64_t C) {
  norm_backward_weight(dweight, static_cast<T*>(nullptr), dout, x, static_cast<const T*>(nullptr), rstd, N, C);
}

#define MEGATON_INSTANTIATE(T)                                                                                       \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t, double);            \
  template void layernorm_backward_input<T>(T*, const T*, const T*, const T*, const T*, const T*, int64_t, int64_t); \
  template void layernorm_backward_weight<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, int64_t);      \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int64_t, int64_t, double);                            \
  template void rmsnorm_backward_input<T>(T*, const T*, const T*, const T*, const T*, int64_t, int64_t);             \
  template void rmsnorm_backward_weight<T>(T*, const T*, const T*, const T*, int64_t, int64_t);
MEGATON_INSTANTIATE(float)
MEGATON_INSTANTIATE(double)
#undef MEGATON_INSTANTIATE

}  // namespace megaton::kernels::cpu
