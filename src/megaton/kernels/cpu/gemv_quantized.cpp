#include "megaton/kernels/cpu/gemv_quantized.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "megaton/core/error.h"
#include "megaton/kernels/cpu/gemv_dot.h"

namespace megaton::kernels::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 15;  // weight elements below which one thread is faster

int64_t scale_cols(const QuantizedRows& w, int64_t in_f) { return (in_f + w.block_cols - 1) / w.block_cols; }

// The x rows of an int8 GEMV on the integer dot path (gemv_dot.h's dot_int8_split), row n as
// x = unit[n] * (hi + lo / 2^15): unit = max|x| / 32767, hi = x / unit rounded, lo = the remainder
// (within +-1/2) times 2^15 rounded, both computed in double. Each element is held to within
// max|x| * 2^-31, finer than an fp32 x's own rounding for elements within 2^7 of the row's largest,
// and the dot products of the codes with hi and lo are exact integers. Empty when a row is not all
// finite (the fp32 path then carries its NaN / inf into y as the fp32 product would).
struct SplitX {
  std::vector<int16_t> hi, lo;
  std::vector<double> unit;
};

SplitX split_x(const float* x, int64_t rows, int64_t in_f) {
  SplitX s{std::vector<int16_t>(static_cast<size_t>(rows * in_f)),
           std::vector<int16_t>(static_cast<size_t>(rows * in_f)), std::vector<double>(static_cast<size_t>(rows))};
  for (int64_t n = 0; n < rows; ++n) {
    const float* xr = x + n * in_f;
    double top = 0;
    for (int64_t c = 0; c < in_f; ++c) {
      if (!std::isfinite(xr[c])) return {};
      top = std::max(top, std::abs(static_cast<double>(xr[c])));
    }
    const double unit = top > 0 ? top / 32767 : 1.0;
    s.unit[static_cast<size_t>(n)] = unit;
    for (int64_t c = 0; c < in_f; ++c) {
      const double t = xr[c] / unit, h = std::nearbyint(t);
      const size_t i = static_cast<size_t>(n * in_f + c);
      s.hi[i] = static_cast<int16_t>(h);
      s.lo[i] = static_cast<int16_t>(std::nearbyint((t - h) * 0x1p15));
    }
  }
  return s;
}

// The int8 rows' dots with every x row on the integer path (gemv_dot.h), into dots[rows].
template <typename C>
void int8_split_dots(const C* w, const SplitX& x, int64_t rows, int64_t in_f, double* dots) {
#ifdef MEGATON_GEMV_INT8_SPLIT
  if constexpr (std::is_same_v<C, int8_t>)
    return gemv_detail::dot_int8_split_rows(w, x.hi.data(), x.lo.data(), in_f, in_f, rows, dots);
#endif
  (void)w, (void)x, (void)rows, (void)in_f, (void)dots;
  fail("quantized gemv: the int8 dot path is not compiled in");
}

// With one scale per row band (int8 per row, per-tensor) the scale multiplies the row's dot
// product. With blocks along the row (128 x 128), x is multiplied by the band's block scales once per
// band instead (each thread keeps its own scaled copy of the x rows, remade when its weight rows
// enter the next band), so the inner loop stays the plain dot product of the codes. Each weight row
// is read once for all the x rows [rows, in_f].
template <typename C, typename T, typename B>
void gemv_rows(T* y, const float* x, const C* codes, const QuantizedRows& w, const B* bias, int64_t rows, int64_t in_f,
               int64_t out_f, bool simd) {
  const int64_t sc = scale_cols(w, in_f);
  SplitX split;
#ifdef MEGATON_GEMV_INT8_SPLIT
  if constexpr (std::is_same_v<C, int8_t>)
    if (simd && sc == 1) split = split_x(x, rows, in_f);
#endif
#pragma omp parallel if (out_f * in_f >= kParallelMin)
  {
    std::vector<float> xs(sc == 1 ? 0 : static_cast<size_t>(rows * in_f));
    std::vector<double> dots(static_cast<size_t>(rows));
    std::vector<float> fdots(static_cast<size_t>(rows));
    int64_t band = -1;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < out_f; ++r) {
      const float* s = w.scale_inv + (r / w.block_rows) * sc;
      if (sc != 1 && r / w.block_rows != band) {
        band = r / w.block_rows;
        for (int64_t n = 0; n < rows; ++n)
          for (int64_t c = 0; c < in_f; ++c)
            xs[static_cast<size_t>(n * in_f + c)] = x[n * in_f + c] * s[c / w.block_cols];
      }
      const float b = bias ? static_cast<float>(load(bias[r])) : 0.0f;
      if (!split.unit.empty()) {
        int8_split_dots(codes + r * in_f, split, rows, in_f, dots.data());
        for (int64_t n = 0; n < rows; ++n)
          y[n * out_f + r] = store<T>(
              static_cast<float>(s[0] * split.unit[static_cast<size_t>(n)] * dots[static_cast<size_t>(n)]) + b);
        continue;
      }
      gemv_detail::dot_rows(codes + r * in_f, sc == 1 ? x : xs.data(), in_f, in_f, rows, fdots.data(), simd);
      for (int64_t n = 0; n < rows; ++n) {
        const float v = sc == 1 ? s[0] * fdots[static_cast<size_t>(n)] : fdots[static_cast<size_t>(n)];
        y[n * out_f + r] = store<T>(v + b);
      }
    }
  }
}

// Calls f with a typed pointer to the codes.
template <typename F>
void with_codes(const QuantizedRows& w, F&& f) {
  if (w.dtype == DType::I8) return f(static_cast<const int8_t*>(w.codes));
  if (w.dtype == DType::F8E4M3) return f(static_cast<const Float8E4M3*>(w.codes));
  fail("quantized gemv: weight codes of dtype ", dtype_name(w.dtype), " (expected i8 or f8e4m3)");
}

}  // namespace

template <typename T, typename B>
void gemv_quantized(T* y, const T* x, const QuantizedRows& w, const B* bias, int64_t rows, int64_t in_f, int64_t out_f,
                    GemvPath path) {
  if (path == GemvPath::Simd && !gemv_simd_compiled())
    fail("quantized gemv: the AVX2/FMA path was not compiled in (build for such a CPU, MEGATON_NATIVE=ON)");
  if (w.block_rows < 1 || w.block_cols < 1) fail("quantized gemv: block sizes must be positive");
  const bool simd = path != GemvPath::Portable && gemv_simd_compiled();
  std::vector<float> xf(static_cast<size_t>(rows * in_f));  // x widened once: every weight row reads it
  for (int64_t i = 0; i < rows * in_f; ++i) xf[static_cast<size_t>(i)] = load(x[i]);
  with_codes(w, [&](const auto* codes) { gemv_rows(y, xf.data(), codes, w, bias, rows, in_f, out_f, simd); });
}

void dequantize_rows(float* out, const QuantizedRows& w, int64_t in_f, int64_t r0, int64_t r1) {
  const int64_t sc = scale_cols(w, in_f);
  with_codes(w, [&](const auto* codes) {
#pragma omp parallel for schedule(static) if ((r1 - r0) * in_f >= kParallelMin)
    for (int64_t r = r0; r < r1; ++r) {
      const float* s = w.scale_inv + (r / w.block_rows) * sc;
      for (int64_t c = 0; c < in_f; c += w.block_cols)
        gemv_detail::widen_scaled(out + (r - r0) * in_f + c, codes + r * in_f + c, std::min(w.block_cols, in_f - c),
                                  s[c / w.block_cols]);
    }
  });
}

#define MEGATON_GEMV_QUANTIZED(T, B) \
  template void gemv_quantized<T, B>(T*, const T*, const QuantizedRows&, const B*, int64_t, int64_t, int64_t, GemvPath);
MEGATON_GEMV_QUANTIZED(float, float)
MEGATON_GEMV_QUANTIZED(BFloat16, float)
MEGATON_GEMV_QUANTIZED(BFloat16, BFloat16)
#undef MEGATON_GEMV_QUANTIZED

}  // namespace megaton::kernels::cpu
