#include "megaton/kernels/cpu/gemv.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "megaton/core/error.h"
#include "megaton/kernels/cpu/gemv_dot.h"
#include "megaton/kernels/cpu/gemv_row_pairs.h"
#include "megaton/kernels/cpu/parallel_min.h"

namespace megaton::kernels::cpu {
namespace {

// x [rows, in_f]: each weight row is read from memory once, for all the x rows. One x row (decode)
// takes the weight rows two at a time (gemv_row_pairs.h says which two).
template <typename T, typename W, typename B, typename X>
void gemv_rows(T* y, const X* x, const W* w, const B* bias, int64_t rows, int64_t in_f, int64_t out_f, bool simd) {
  const auto b = [&](int64_t r) { return bias ? static_cast<float>(load(bias[r])) : 0.0f; };
#pragma omp parallel if (out_f * in_f >= kParallelMin)
  {
    std::vector<float> dots(static_cast<size_t>(std::max<int64_t>(rows, 2)));
    if (rows == 1) {
      for_row_pairs(
          out_f, out_f,
          [&](int64_t r, int64_t r2) {
            gemv_detail::dot_pair(w + r * in_f, (r2 - r) * in_f, x, in_f, dots.data(), simd);
            y[r] = store<T>(dots[0] + b(r));
            y[r2] = store<T>(dots[1] + b(r2));
          },
          [&](int64_t r) { y[r] = store<T>(gemv_detail::dot(w + r * in_f, x, in_f, simd) + b(r)); });
    } else {
#pragma omp for schedule(static)
      for (int64_t r = 0; r < out_f; ++r) {
        gemv_detail::dot_rows(w + r * in_f, x, in_f, in_f, rows, dots.data(), simd);
        for (int64_t n = 0; n < rows; ++n) y[n * out_f + r] = store<T>(dots[static_cast<size_t>(n)] + b(r));
      }
    }
  }
}

}  // namespace

bool gemv_simd_compiled() { return gemv_detail::simd_compiled(); }

template <typename T, typename W, typename B>
void gemv(T* y, const T* x, const W* w, const B* bias, int64_t rows, int64_t in_f, int64_t out_f, GemvPath path) {
  if (path == GemvPath::Simd && !gemv_simd_compiled())
    fail("gemv: the AVX2/FMA path was not compiled in (build for a CPU with AVX2, MEGATON_NATIVE=ON)");
  const bool simd = path != GemvPath::Portable && gemv_simd_compiled();
  if constexpr (std::is_same_v<T, BFloat16> && std::is_same_v<W, BFloat16> && gemv_detail::bf16_pairs_compiled()) {
    // bf16 x bf16 on a CPU with AVX512-BF16: both stay 16-bit (cpu/gemv_dot.h, dot of BFloat16 pairs).
    if (simd) return gemv_rows(y, x, w, bias, rows, in_f, out_f, true);
  }
  // x is read by every weight row: widen it once (a bf16 x) so the inner loops load fp32 from L1.
  std::vector<float> xf(static_cast<size_t>(rows * in_f));
  for (int64_t i = 0; i < rows * in_f; ++i) xf[static_cast<size_t>(i)] = load(x[i]);
  gemv_rows(y, xf.data(), w, bias, rows, in_f, out_f, simd);
}

#define MEGATON_GEMV(T, W, B) \
  template void gemv<T, W, B>(T*, const T*, const W*, const B*, int64_t, int64_t, int64_t, GemvPath);
MEGATON_GEMV(float, float, float)
MEGATON_GEMV(float, BFloat16, float)
MEGATON_GEMV(BFloat16, BFloat16, BFloat16)
MEGATON_GEMV(BFloat16, BFloat16, float)
#undef MEGATON_GEMV

}  // namespace megaton::kernels::cpu
