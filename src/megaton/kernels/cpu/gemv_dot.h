// The row dot products of the streaming GEMVs (cpu/gemv.cpp for f32 / bf16 weights,
// cpu/gemv_quantized.cpp for 8-bit codes): one template per path over the stored weight type W, so
// every weight format shares the same loops and the same association of the partial sums. What a
// format adds is how one weight (load) or eight / sixteen (load8 / load16) widen to fp32.
//   Portable: plain C++ for any CPU. Simd: AVX2 + FMA (+ F16C, for E4M3) intrinsics, compiled where the
//   build targets them (-march=native on such a CPU, MEGATON_GEMV_SIMD defined); on a CPU with
//   AVX-512 (MEGATON_GEMV_AVX512) the same loops sixteen lanes wide: decode is bound by the widening
//   instructions as much as by memory once weights are 8 or 16 bits, and half as many of them per
//   weight is what brings bf16 / int8 / E4M3 rows nearer the bandwidth limit.
#pragma once
#include <array>
#include <cstdint>

#include "megaton/core/dtype.h"
#include "megaton/core/fp8_format.h"
#include "megaton/kernels/cpu/element.h"
#include "megaton/kernels/cpu/prefetch.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*() and trip its own -Wuninitialized /
// -Wmaybe-uninitialized once inlined (GCC bug 105593, fixed in 13): silenced for these headers only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#define MEGATON_GEMV_SIMD 1
#if defined(__AVX512F__)
#define MEGATON_GEMV_AVX512 1
#endif
#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define MEGATON_GEMV_BF16_PAIRS 1
#endif
#endif

namespace megaton::kernels::cpu::gemv_detail {

using cpu::load;
inline float load(int8_t v) { return static_cast<float>(v); }
// Every E4M3 code's exact value (NaN codes decode to NaN), looked up per weight.
inline const std::array<float, 256> kE4M3Values = [] {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = fp8::decode(static_cast<uint8_t>(c), fp8::Format::E4M3);
  return t;
}();
inline float load(Float8E4M3 v) { return kE4M3Values[v.bits]; }

// Eight partial sums, combined pairwise at the end: the same association in both paths' main
// loop, and eight independent chains so that the adds overlap.
template <typename W>
float dot_portable(const W* w, const float* x, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += load(w[i + j]) * x[i + j];
  float tail = 0;
  for (; i < n; ++i) tail += load(w[i]) * x[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

#ifdef MEGATON_GEMV_SIMD
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
// bf16 is the upper half of an fp32: zero-extend eight of them to 32 bits and shift into place.
inline __m256 load8(const BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
// E4M3 (bias 7, 3 mantissa bits) shifted into an fp16's fields: code c sign-extended to 16 bits and
// shifted left by 7 puts its mantissa in fp16's top mantissa bits 7..9, its exponent in bits 10..13
// and copies of the sign in bits 14..15; clearing bit 14 leaves an fp16 (bias 15) equal to the
// code's value times 2^-8, subnormal codes on fp16 subnormals of the same ratio, which VCVTPH2PS
// widens exactly. The 2^-8 is not multiplied back per weight: dot_lanes scales each finished sum by
// simd_unit (exact), widen_scaled each weight. The previous route, shifting the code into an fp32
// (value x 2^-120) and multiplying by 2^120, made fp32 subnormals of the subnormal codes, and each
// multiply that met one took a microcode assist: 12 layers of 110M-shape GEMVs ran at 1.3 GB/s of
// codes with 1 code in 16 subnormal against 28 GB/s without. Finite codes only: the NaN codes
// 0x7f / 0xff would read as +-480; the quantiser never writes them and loaded weights are checked.
inline __m128i e4m3_to_f16_bits(__m128i sign_extended) {
  return _mm_and_si128(_mm_slli_epi16(sign_extended, 7), _mm_set1_epi16(static_cast<short>(0xbfff)));
}
inline __m256 load8(const Float8E4M3* p) {
  return _mm256_cvtph_ps(e4m3_to_f16_bits(_mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))));
}

// What a SIMD widening's value is multiplied by to be the weight's value: a power of two, exact.
template <typename W>
inline constexpr float simd_unit = 1.0f;
template <>
inline constexpr float simd_unit<Float8E4M3> = 256.0f;

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

#ifdef MEGATON_GEMV_AVX512
// The sixteen-lane widenings: the same bit manipulations as load8 above.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const BFloat16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 load16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline __m512 load16(const Float8E4M3* p) {
  const __m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16(static_cast<short>(0xbfff))));
}

// 64 E4M3 codes into four registers: load16's shift and mask, each on 32 codes (a zmm of fp16
// fields) and VCVTPH2PS on either half. An E4M3 row with huge-page weights is bound by the
// widening's vector instructions (ports 0 and 5 on Intel), not by memory: five per 16 codes here
// against six, 16 llama3-1b-shape layers 23.4 -> 25.6 GB/s on 2 threads (int8's three: 31).
inline void load64(const Float8E4M3* p, __m512 out[4]) {
  const __m512i keep = _mm512_set1_epi16(static_cast<short>(0xbfff));
  for (int h = 0; h < 2; ++h) {
    const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * h)));
    const __m512i f = _mm512_and_si512(_mm512_slli_epi16(w, 7), keep);
    out[2 * h] = _mm512_cvtph_ps(_mm512_castsi512_si256(f));
    out[2 * h + 1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(f, 1));
  }
}

// One register width of the SIMD loop: how many weights a step takes, and the operations on a
// register of fp32 lanes (weights4: four registers' worth at once, where a format has a wider
// widening).
struct Lanes16 {
  using V = __m512;
  static constexpr int64_t kWeights = 16;
  static V zero() { return _mm512_setzero_ps(); }
  template <typename W>
  static V weights(const W* p) { return load16(p); }
  static void weights4(const Float8E4M3* p, V out[4]) { load64(p, out); }
  static V xs(const float* p) { return _mm512_loadu_ps(p); }
  static V fma(V w, V x, V acc) { return _mm512_fmadd_ps(w, x, acc); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static float sum(V v) { return _mm512_reduce_add_ps(v); }
  static V mul_by(float s) { return _mm512_set1_ps(s); }
  static V scaled(V w, V s) { return _mm512_mul_ps(w, s); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
};
using SimdLanes = Lanes16;
#else
struct Lanes8 {
  using V = __m256;
  static constexpr int64_t kWeights = 8;
  static V zero() { return _mm256_setzero_ps(); }
  template <typename W>
  static V weights(const W* p) { return load8(p); }
  static V xs(const float* p) { return _mm256_loadu_ps(p); }
  static V fma(V w, V x, V acc) { return _mm256_fmadd_ps(w, x, acc); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static float sum(V v) { return hsum(v); }
  static V mul_by(float s) { return _mm256_set1_ps(s); }
  static V scaled(V w, V s) { return _mm256_mul_ps(w, s); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
};
using SimdLanes = Lanes8;
#endif  // MEGATON_GEMV_AVX512

// Four accumulators per (weight row, x row) pair (four independent chains cover the FMA latency),
// 4 x L::kWeights weights per iteration, then single steps, then a scalar tail; the four are added
// pairwise at the end. R weight rows (w + r * wld) times G x rows (x + g * ld) at once, into
// out[r * G + g]: each weight register is widened once for all G x rows, and each x register loaded
// once for all R weight rows. Every chain sees the same products in the same order whatever R and G
// are, so a dot product's bits do not depend on which rows shared its call.
template <typename L, int R, int G, typename W, typename X>
void dot_lanes(const W* w, int64_t wld, const X* x, int64_t ld, int64_t n, float* out) {
  constexpr int64_t k = L::kWeights;
  using WV = decltype(L::weights(w));
  typename L::V a[R][G][4];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) a[r][g][0] = a[r][g][1] = a[r][g][2] = a[r][g][3] = L::zero();
  int64_t i = 0;
  for (; i + 4 * k <= n; i += 4 * k) {
    WV wv[R][4];
    for (int r = 0; r < R; ++r) {
      const W* wr = w + r * wld + i;
      if constexpr (sizeof(W) == 1)  // 8-bit codes: the rows ahead (prefetch.h says why not wider weights)
        prefetch_lines(wr, kPrefetchBytes, 4 * k);
      if constexpr (requires { L::weights4(wr, wv[r]); })
        L::weights4(wr, wv[r]);
      else
        for (int j = 0; j < 4; ++j) wv[r][j] = L::weights(wr + j * k);
    }
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < 4; ++j) {
        const auto xv = L::xs(x + g * ld + i + j * k);
        for (int r = 0; r < R; ++r) a[r][g][j] = L::fma(wv[r][j], xv, a[r][g][j]);
      }
  }
  for (; i + k <= n; i += k) {
    WV wv[R];
    for (int r = 0; r < R; ++r) wv[r] = L::weights(w + r * wld + i);
    for (int g = 0; g < G; ++g) {
      const auto xv = L::xs(x + g * ld + i);
      for (int r = 0; r < R; ++r) a[r][g][0] = L::fma(wv[r], xv, a[r][g][0]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) {
      float tail = 0;
      for (int64_t j = i; j < n; ++j) tail += load(w[r * wld + j]) * load(x[g * ld + j]);
      const float sum = L::sum(L::add(L::add(a[r][g][0], a[r][g][1]), L::add(a[r][g][2], a[r][g][3])));
      out[r * G + g] = sum * simd_unit<W> + tail;
    }
}
#endif

// How many x rows a dot kernel takes at once: four x rows' four accumulators, four widened weight
// registers and the x loads fit AVX-512's 32 registers; AVX2's 16 hold two rows' worth.
#ifdef MEGATON_GEMV_AVX512
inline constexpr int kRowGroup = 4;
#else
inline constexpr int kRowGroup = 2;
#endif

// Calls f.template operator()<G>(first row) over rows [g, rows) in groups of G, the rest as one
// smaller group.
template <int G = kRowGroup, typename F>
void for_row_groups(int64_t rows, F&& f, int64_t g = 0) {
  for (; g + G <= rows; g += G) f.template operator()<G>(g);
  if constexpr (G > 1)
    if (g < rows) for_row_groups<G - 1>(rows, f, g);
}

#ifdef MEGATON_GEMV_SIMD
// With lanes L: one weight row and one x row; two weight rows (wld apart) and one x row, into
// out[2]; one weight row and `rows` x rows [rows, ld] in row groups, into out[rows].
template <typename L, typename W, typename X>
float dot_one(const W* w, const X* x, int64_t n) {
  float out;
  dot_lanes<L, 1, 1>(w, 0, x, 0, n, &out);
  return out;
}
template <typename L, typename W, typename X>
void dot_two(const W* w, int64_t wld, const X* x, int64_t n, float* out) {
  dot_lanes<L, 2, 1>(w, wld, x, 0, n, out);
}
template <typename L, typename W, typename X>
void dot_groups(const W* w, const X* x, int64_t ld, int64_t n, int64_t rows, float* out) {
  for_row_groups(rows, [&]<int G>(int64_t g) { dot_lanes<L, 1, G>(w, 0, x + g * ld, ld, n, out + g); });
}
#endif

#ifdef MEGATON_GEMV_BF16_PAIRS
// bf16 weights times a bf16 x (bf16 decode) with VDPBF16PS: each instruction takes 32 weights and
// 32 x values as they are stored and adds both products of every pair of neighbours to an fp32
// lane, one rounding after each (bf16 products are exact in fp32), as two FMAs on the widened
// values would; only bf16 subnormals (below 1e-38) are read as zero. No widening instructions at
// all: the loop is a stream of loads and dot products.
struct Bf16Pairs {
  using V = __m512;
  static constexpr int64_t kWeights = 32;
  static V zero() { return _mm512_setzero_ps(); }
  static __m512bh weights(const BFloat16* p) { return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p)); }
  static __m512bh xs(const BFloat16* p) { return weights(p); }
  static V fma(__m512bh w, __m512bh x, V acc) { return _mm512_dpbf16_ps(acc, w, x); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static float sum(V v) { return _mm512_reduce_add_ps(v); }
};

// bf16 weights and a bf16 x: only the pair path has these overloads (gemv.cpp reaches them only there).
inline float dot(const BFloat16* w, const BFloat16* x, int64_t n, bool /*simd*/) { return dot_one<Bf16Pairs>(w, x, n); }
inline void dot_rows(const BFloat16* w, const BFloat16* x, int64_t ld, int64_t n, int64_t rows, float* out,
                     bool /*simd*/) {
  dot_groups<Bf16Pairs>(w, x, ld, n, rows, out);
}
inline void dot_pair(const BFloat16* w, int64_t wld, const BFloat16* x, int64_t n, float* out, bool /*simd*/) {
  dot_two<Bf16Pairs>(w, wld, x, n, out);
}
#endif

constexpr bool bf16_pairs_compiled() {
#ifdef MEGATON_GEMV_BF16_PAIRS
  return true;
#else
  return false;
#endif
}

// out[i] = value(w[i]) * scale for n weights: the prefill GEMM's dequantised band (and loading). The
// SIMD widenings are exact, so both paths write the same floats.
template <typename W>
void widen_scaled(float* out, const W* w, int64_t n, float scale) {
  int64_t i = 0;
#ifdef MEGATON_GEMV_SIMD
  using L = SimdLanes;
  const typename L::V s = L::mul_by(scale);
  for (; i + L::kWeights <= n; i += L::kWeights) {
    auto v = L::weights(w + i);
    if constexpr (simd_unit<W> != 1.0f) v = L::scaled(v, L::mul_by(simd_unit<W>));  // exact, then one rounding
    L::store(out + i, L::scaled(v, s));
  }
#endif
  for (; i < n; ++i) out[i] = load(w[i]) * scale;
}

// The dot product of one weight row with one x row on the chosen path (decode's common case, kept
// inline in the callers' row loops: through dot_rows a one-row GEMV ran 8-10% slower).
template <typename W>
float dot(const W* w, const float* x, int64_t n, bool simd) {
#ifdef MEGATON_GEMV_SIMD
  if (simd) return dot_one<SimdLanes>(w, x, n);
#endif
  (void)simd;
  return dot_portable(w, x, n);
}

// The dot products of two weight rows (w and w + wld) with one x row, into out[2], each with the bits
// dot gives it: decode's row loops take their rows in pairs, so that each x register is loaded once
// for two rows and each thread keeps two weight streams in flight (a 2-thread int8 GEMV over 85 MB:
// 42-46 GB/s against 34-38 one row at a time).
template <typename W>
void dot_pair(const W* w, int64_t wld, const float* x, int64_t n, float* out, bool simd) {
#ifdef MEGATON_GEMV_SIMD
  if (simd) return dot_two<SimdLanes>(w, wld, x, n, out);
#endif
  (void)simd;
  out[0] = dot_portable(w, x, n);
  out[1] = dot_portable(w + wld, x, n);
}

// The dot products of one weight row with the x rows [rows, ld] on the chosen path, into out[rows].
template <typename W>
void dot_rows(const W* w, const float* x, int64_t ld, int64_t n, int64_t rows, float* out, bool simd) {
#ifdef MEGATON_GEMV_SIMD
  if (simd) return dot_groups<SimdLanes>(w, x, ld, n, rows, out);
#endif
  (void)simd;
  for (int64_t g = 0; g < rows; ++g) out[g] = dot_portable(w, x + g * ld, n);
}

constexpr bool simd_compiled() {
#ifdef MEGATON_GEMV_SIMD
  return true;
#else
  return false;
#endif
}

}  // namespace megaton::kernels::cpu::gemv_detail
