// int8 weight rows times an fp32 x held in fixed point: the decode GEMV of int8 per-row weights
// (cpu/gemv_quantized.cpp). Widening every code to fp32 (sign-extend, convert, FMA: three vector
// instructions per 16 codes) bound a GEMV whose codes come from cache by those instructions: a
// 2-thread 768 x 2304 int8 GEMV from L3 ran 28 GB/s widened, 46 in fixed point (docs/performance.md,
// "Per-token overhead: ...; int8 rows against a fixed-point x"). Here x is written once per call as
// 30-bit integers, hi * 2^15 + lo with both halves int16, and each 32 codes take one
// sign extension to int16 and two integer dot products (VPDPWSSD with AVX512-VNNI; VPMADDWD + add
// elsewhere): the products and their sums are exact, so every path, every thread count and every
// grouping of rows gives the same bits, and the only rounding besides the final conversion is x's
// own, at most 2^-31 of the row's largest |x| per element (the float path's accumulation error is
// ~1e-7 of sum |w x|).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "megaton/kernels/cpu/gemv_dot.h"

namespace megaton::kernels::cpu::gemv_detail {

// One x row: x[c] ~= (hi(c) * 2^15 + lo(c)) * step, lo in [0, 2^15). The halves are interleaved by
// blocks of 32 (32 hi, then the same columns' 32 lo) so that x is one stream of loads: a 2-thread
// 768-column GEMV over 84 MB ran at 43-45 GB/s with two arrays, 47.5-50 interleaved.
inline constexpr int64_t kFixedBlock = 32;
constexpr int64_t fixed_hi_offset(int64_t c) { return 2 * kFixedBlock * (c / kFixedBlock) + c % kFixedBlock; }
struct FixedRow {
  const int16_t* x;
  double step;
  const int16_t* hi(int64_t c) const { return x + fixed_hi_offset(c); }
  const int16_t* lo(int64_t c) const { return hi(c) + kFixedBlock; }
};

// The fixed-point form of x rows [rows, n].
class FixedX {
 public:
  // False (and nothing kept) when an x is not finite: the caller keeps the float path, whose
  // products carry the NaN or infinity into y.
  bool build(const float* x, int64_t rows, int64_t n) {
    ld_ = 2 * kFixedBlock * ((n + kFixedBlock - 1) / kFixedBlock);
    x_.resize(static_cast<size_t>(rows * ld_));
    step_.assign(static_cast<size_t>(rows), 0.0);
    for (int64_t g = 0; g < rows; ++g) {
      const float* xr = x + g * n;
      float amax = 0;
      for (int64_t c = 0; c < n; ++c) {
        if (!std::isfinite(xr[c])) return false;
        amax = std::max(amax, std::abs(xr[c]));
      }
      // 2^30 - 64 units for the largest |x|: rounding never carries it past 2^30 - 1, so hi fits int16.
      const double units = amax > 0 ? (1073741824.0 - 64.0) / amax : 0.0;
      step_[static_cast<size_t>(g)] = amax > 0 ? 1.0 / units : 0.0;
      int16_t* out = x_.data() + g * ld_;
      for (int64_t c = 0; c < n; ++c) {
        const auto v = static_cast<int32_t>(std::nearbyint(static_cast<double>(xr[c]) * units));
        out[fixed_hi_offset(c)] = static_cast<int16_t>(v >> 15);  // arithmetic: floor
        out[fixed_hi_offset(c) + kFixedBlock] = static_cast<int16_t>(v & 0x7fff);
      }
    }
    return true;
  }
  FixedRow row(int64_t g) const { return {x_.data() + g * ld_, step_[static_cast<size_t>(g)]}; }
  // x row g's dot product from its exact integer sum.
  float value(int64_t g, int64_t sum) const {
    return static_cast<float>(static_cast<double>(sum) * step_[static_cast<size_t>(g)]);
  }

 private:
  int64_t ld_ = 0;
  std::vector<int16_t> x_;
  std::vector<double> step_;
};

// Codes per flush of the int32 lanes into int64: a lane adds at most 2 x 128 x 2^15 = 2^23 per
// step and takes one step per 32 codes (16-lane AVX2) or 64 (AVX-512), so 4096 codes stay below 2^30.
inline constexpr int64_t kFixedFlush = 4096;

inline int64_t fixed_at(const FixedRow& x, int64_t c) { return int64_t{*x.hi(c)} * 32768 + *x.lo(c); }

#ifdef MEGATON_GEMV_SIMD
#ifdef MEGATON_GEMV_AVX512
struct FixedLanes {
  using V = __m512i;
  static constexpr int64_t kCodes = 32;
  static V zero() { return _mm512_setzero_si512(); }
  static V codes(const int8_t* p) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static V xs(const int16_t* p) { return _mm512_loadu_si512(p); }
  static V dot(V acc, V w, V x) {
#ifdef __AVX512VNNI__
    return _mm512_dpwssd_epi32(acc, w, x);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(w, x));
#endif
  }
  static int64_t sum(V v) {
    const __m512i a = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(v));
    const __m512i b = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(v, 1));
    return _mm512_reduce_add_epi64(_mm512_add_epi64(a, b));
  }
};
#else
struct FixedLanes {
  using V = __m256i;
  static constexpr int64_t kCodes = 16;
  static V zero() { return _mm256_setzero_si256(); }
  static V codes(const int8_t* p) { return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static V xs(const int16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static V dot(V acc, V w, V x) { return _mm256_add_epi32(acc, _mm256_madd_epi16(w, x)); }
  static int64_t sum(V v) {
    const __m256i s = _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(v)),
                                       _mm256_cvtepi32_epi64(_mm256_extracti128_si256(v, 1)));
    alignas(32) int64_t l[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(l), s);
    return (l[0] + l[1]) + (l[2] + l[3]);
  }
};
#endif

// R weight rows (w + r * wld) times G fixed-point x rows, exact sums into out[r * G + g]: each code
// register is widened once for all G x rows, each x register loaded once for all R weight rows; two
// accumulators per (row, x row, half) so that the dot products' latency overlaps.
template <int R, int G>
void dot_fixed_lanes(const int8_t* w, int64_t wld, const FixedRow* x, int64_t n, int64_t* out) {
  using L = FixedLanes;
  constexpr int64_t k = L::kCodes;
  int64_t hi[R][G] = {}, lo[R][G] = {};
  int64_t i = 0;
  while (i + 2 * k <= n) {
    const int64_t end = std::min(i + kFixedFlush, n - (n - i) % (2 * k));
    typename L::V ah[R][G][2], al[R][G][2];
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g) ah[r][g][0] = ah[r][g][1] = al[r][g][0] = al[r][g][1] = L::zero();
    for (; i < end; i += 2 * k) {
      typename L::V wv[R][2];
      for (int r = 0; r < R; ++r) {
        const int8_t* wr = w + r * wld + i;
        prefetch_lines(wr, kPrefetchBytes, 2 * k);
        wv[r][0] = L::codes(wr);
        wv[r][1] = L::codes(wr + k);
      }
      for (int g = 0; g < G; ++g)
        for (int j = 0; j < 2; ++j) {
          const auto xh = L::xs(x[g].hi(i + j * k)), xl = L::xs(x[g].lo(i + j * k));
          for (int r = 0; r < R; ++r) {
            ah[r][g][j] = L::dot(ah[r][g][j], wv[r][j], xh);
            al[r][g][j] = L::dot(al[r][g][j], wv[r][j], xl);
          }
        }
    }
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g) {
        hi[r][g] += L::sum(ah[r][g][0]) + L::sum(ah[r][g][1]);
        lo[r][g] += L::sum(al[r][g][0]) + L::sum(al[r][g][1]);
      }
  }
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) {
      int64_t tail = 0;
      for (int64_t c = i; c < n; ++c) tail += int64_t{w[r * wld + c]} * fixed_at(x[g], c);
      out[r * G + g] = hi[r][g] * 32768 + lo[r][g] + tail;
    }
}
#endif

// The exact sum of one weight row's codes times x row's fixed-point values, on either path.
inline int64_t dot_fixed_portable(const int8_t* w, const FixedRow& x, int64_t n) {
  int64_t s = 0;
  for (int64_t c = 0; c < n; ++c) s += int64_t{w[c]} * fixed_at(x, c);
  return s;
}

// Two weight rows (w and w + wld) times one x row, into out[2]: decode's row pairs.
inline void dot_fixed_pair(const int8_t* w, int64_t wld, const FixedRow& x, int64_t n, int64_t* out, bool simd) {
#ifdef MEGATON_GEMV_SIMD
  if (simd) return dot_fixed_lanes<2, 1>(w, wld, &x, n, out);
#endif
  (void)simd;
  out[0] = dot_fixed_portable(w, x, n);
  out[1] = dot_fixed_portable(w + wld, x, n);
}

// One weight row times x rows [0, rows), into out[rows]; rows == 1 is a pair's odd last row.
inline void dot_fixed_rows(const int8_t* w, const FixedRow* x, int64_t n, int64_t rows, int64_t* out, bool simd) {
#ifdef MEGATON_GEMV_SIMD
  if (simd) return for_row_groups(rows, [&]<int G>(int64_t g) { dot_fixed_lanes<1, G>(w, 0, x + g, n, out + g); });
#endif
  (void)simd;
  for (int64_t g = 0; g < rows; ++g) out[g] = dot_fixed_portable(w, x[g], n);
}

}  // namespace megaton::kernels::cpu::gemv_detail
