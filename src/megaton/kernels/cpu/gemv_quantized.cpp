#include "megaton/kernels/cpu/gemv_quantized.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "megaton/core/error.h"
#include "megaton/kernels/cpu/gemv_dot.h"
#include "megaton/kernels/cpu/gemv_fixed_x.h"
#include "megaton/kernels/cpu/gemv_row_pairs.h"
#include "megaton/kernels/cpu/parallel_min.h"

namespace megaton::kernels::cpu {
namespace {

int64_t scale_cols(const QuantizedRows& w, int64_t in_f) { return (in_f + w.block_cols - 1) / w.block_cols; }

// y[n, r] = row r's dot product d times its row scale (row_scaled: one scale per row band; null when
// x already carried the block scales) plus its bias, as one explicit FMA so that every path rounds
// alike (left to -ffp-contract, the inline one-row path and the row loop once contracted differently).
template <typename T, typename B>
void emit_row(T* y, int64_t n, int64_t r, int64_t out_f, const QuantizedRows* row_scaled, float d, const B* bias) {
  const float b = bias ? static_cast<float>(load(bias[r])) : 0.0f;
  y[n * out_f + r] = store<T>(row_scaled ? std::fma(row_scaled->scale_inv[r / row_scaled->block_rows], d, b) : d + b);
}

// int8 codes with one scale per row band against x in fixed point (gemv_fixed_x.h): the same walk
// over the rows as gemv_rows below, with exact integer sums.
template <typename T, typename B>
void gemv_rows_fixed(T* y, const gemv_detail::FixedX& xq, const int8_t* codes, const QuantizedRows& w, const B* bias,
                     int64_t rows, int64_t in_f, int64_t out_f, bool simd) {
  std::vector<gemv_detail::FixedRow> xr;
  for (int64_t n = 0; n < rows; ++n) xr.push_back(xq.row(n));
#pragma omp parallel if (out_f * in_f >= kParallelMin)
  {
    std::vector<int64_t> sums(static_cast<size_t>(std::max<int64_t>(rows, 2)));
    const auto one_row = [&](int64_t r) {
      gemv_detail::dot_fixed_rows(codes + r * in_f, xr.data(), in_f, rows, sums.data(), simd);
      for (int64_t n = 0; n < rows; ++n) emit_row(y, n, r, out_f, &w, xq.value(n, sums[static_cast<size_t>(n)]), bias);
    };
    walk_rows(
        rows, out_f, out_f,
        [&](int64_t r, int64_t r2) {
          gemv_detail::dot_fixed_pair(codes + r * in_f, (r2 - r) * in_f, xr[0], in_f, sums.data(), simd);
          emit_row(y, 0, r, out_f, &w, xq.value(0, sums[0]), bias);
          emit_row(y, 0, r2, out_f, &w, xq.value(0, sums[1]), bias);
        },
        one_row);
  }
}

// With one scale per row band (int8 per row, per-tensor) the scale multiplies the row's dot
// product. With blocks along the row (128 x 128), x is multiplied by the band's block scales once per
// band instead (each thread keeps its own scaled copy of the x rows, remade when its weight rows
// enter the next band), so the inner loop stays the plain dot product of the codes. Each weight row
// is read once for all the x rows [rows, in_f]; one x row (decode) takes the weight rows two at a
// time, both from one band (gemv_row_pairs.h).
template <typename C, typename T, typename B>
void gemv_rows(T* y, const float* x, const C* codes, const QuantizedRows& w, const B* bias, int64_t rows, int64_t in_f,
               int64_t out_f, bool simd) {
  const int64_t sc = scale_cols(w, in_f);
#pragma omp parallel if (out_f * in_f >= kParallelMin)
  {
    std::vector<float> xs(sc == 1 ? 0 : static_cast<size_t>(rows * in_f));
    std::vector<float> dots(static_cast<size_t>(std::max<int64_t>(rows, 2)));
    int64_t band = -1;
    // x for row r's band: x itself, or the band's scaled copy (remade on entering a new band).
    const auto x_for = [&](int64_t r) -> const float* {
      if (sc == 1) return x;
      if (r / w.block_rows != band) {
        band = r / w.block_rows;
        const float* s = w.scale_inv + band * sc;
        // Block by block: a division per element cost as much as the band's dot products.
        for (int64_t n = 0; n < rows; ++n)
          for (int64_t c0 = 0, b = 0; c0 < in_f; c0 += w.block_cols, ++b) {
            const int64_t c1 = std::min(in_f, c0 + w.block_cols);
            for (int64_t c = c0; c < c1; ++c) xs[static_cast<size_t>(n * in_f + c)] = x[n * in_f + c] * s[b];
          }
      }
      return xs.data();
    };
    const auto emit = [&](int64_t n, int64_t r, float d) { emit_row(y, n, r, out_f, sc == 1 ? &w : nullptr, d, bias); };
    const auto one_row = [&](int64_t r) {
      const float* xr = x_for(r);
      if (rows == 1) return emit(0, r, gemv_detail::dot(codes + r * in_f, xr, in_f, simd));
      gemv_detail::dot_rows(codes + r * in_f, xr, in_f, in_f, rows, dots.data(), simd);
      for (int64_t n = 0; n < rows; ++n) emit(n, r, dots[static_cast<size_t>(n)]);
    };
    // Paired rows share a band, so that one scaled copy of x serves both.
    walk_rows(
        rows, out_f, sc == 1 ? out_f : w.block_rows,
        [&](int64_t r, int64_t r2) {
          gemv_detail::dot_pair(codes + r * in_f, (r2 - r) * in_f, x_for(r), in_f, dots.data(), simd);
          emit(0, r, dots[0]);
          emit(0, r2, dots[1]);
        },
        one_row);
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
  gemv_detail::FixedX xq;
  if (w.dtype == DType::I8 && scale_cols(w, in_f) == 1 && xq.build(xf.data(), rows, in_f))
    return gemv_rows_fixed(y, xq, static_cast<const int8_t*>(w.codes), w, bias, rows, in_f, out_f, simd);
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
