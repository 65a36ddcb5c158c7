// The row dot products of the streaming GEMVs (cpu/gemv.cpp for f32 / bf16 weights,
// cpu/gemv_quantized.cpp for 8-bit codes): one template per path over the stored weight type W, so
// every weight format shares the same loops and the same association of the partial sums. What a
// format adds is how one weight (load) or eight / sixteen (load8 / load16) widen to fp32.
//   Portable: plain C++ for any CPU. Simd: AVX2 + FMA intrinsics, compiled where the
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

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
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
// E4M3 (bias 7, 3 mantissa bits) shifted into an fp32's fields: code c sign-extended to 32 bits
// and shifted left by 20 puts its exponent and mantissa bits in fp32's bits 20..26 and copies of
// the sign in bits 27..31; clearing bits 27..30 leaves an fp32 equal to the code's value times
// 2^-120 (subnormal codes land on fp32 subnormals of the same ratio), and multiplying by 2^120 is
// exact. Three integer operations and one multiply; the fp16 route (F16C) ran 2.4x slower here.
// Finite codes only: the NaN codes 0x7f / 0xff would read as +-480; the quantiser never writes them
// and loaded weights are checked for them.
inline __m256 e4m3_bits_to_f32(__m256i sign_extended) {
  const __m256i bits = _mm256_and_si256(_mm256_slli_epi32(sign_extended, 20), _mm256_set1_epi32(0x87ffffff));
  return _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(0x1p120f));
}
inline __m256 load8(const Float8E4M3* p) {
  return e4m3_bits_to_f32(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

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
  const __m512i b = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i bits = _mm512_and_si512(_mm512_slli_epi32(b, 20), _mm512_set1_epi32(0x87ffffff));
  return _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(0x1p120f));
}

// Four accumulators of sixteen lanes: 64 weights per iteration.
template <typename W>
float dot_simd(const W* w, const float* x, int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a0 = _mm512_fmadd_ps(load16(w + i), _mm512_loadu_ps(x + i), a0);
    a1 = _mm512_fmadd_ps(load16(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
    a2 = _mm512_fmadd_ps(load16(w + i + 32), _mm512_loadu_ps(x + i + 32), a2);
    a3 = _mm512_fmadd_ps(load16(w + i + 48), _mm512_loadu_ps(x + i + 48), a3);
  }
  for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(load16(w + i), _mm512_loadu_ps(x + i), a0);
  float tail = 0;
  for (; i < n; ++i) tail += load(w[i]) * x[i];
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))) + tail;
}
#else
// Four accumulators of eight lanes: 32 weights per iteration, four independent FMA chains to
// cover the FMA latency.
template <typename W>
float dot_simd(const W* w, const float* x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(load8(w + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(load8(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    a2 = _mm256_fmadd_ps(load8(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
    a3 = _mm256_fmadd_ps(load8(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(load8(w + i), _mm256_loadu_ps(x + i), a0);
  float tail = 0;
  for (; i < n; ++i) tail += load(w[i]) * x[i];
  return hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3))) + tail;
}
#endif  // MEGATON_GEMV_AVX512
#endif

#ifdef MEGATON_GEMV_BF16_PAIRS
// bf16 weights times a bf16 x (bf16 decode) with VDPBF16PS: each instruction takes 32 weights and
// 32 x values as they are stored and adds both products of every pair of neighbours to an fp32
// lane, one rounding after each (bf16 products are exact in fp32), as two FMAs on the widened
// values would; only bf16 subnormals (below 1e-38) are read as zero. No widening instructions at
// all: the loop is a stream of loads and dot products.
inline float dot_bf16_pairs(const BFloat16* w, const BFloat16* x, int64_t n) {
  const auto pairs = [](const BFloat16* p) { return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p)); };
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 128 <= n; i += 128) {
    a0 = _mm512_dpbf16_ps(a0, pairs(w + i), pairs(x + i));
    a1 = _mm512_dpbf16_ps(a1, pairs(w + i + 32), pairs(x + i + 32));
    a2 = _mm512_dpbf16_ps(a2, pairs(w + i + 64), pairs(x + i + 64));
    a3 = _mm512_dpbf16_ps(a3, pairs(w + i + 96), pairs(x + i + 96));
  }
  for (; i + 32 <= n; i += 32) a0 = _mm512_dpbf16_ps(a0, pairs(w + i), pairs(x + i));
  float tail = 0;
  for (; i < n; ++i) tail += load(w[i]) * load(x[i]);
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))) + tail;
}

// bf16 weights and a bf16 x: only the pair path has this overload (gemv.cpp reaches it only there).
inline float dot(const BFloat16* w, const BFloat16* x, int64_t n, bool /*simd*/) { return dot_bf16_pairs(w, x, n); }
#endif

constexpr bool bf16_pairs_compiled() {
#ifdef MEGATON_GEMV_BF16_PAIRS
  return true;
#else
  return false;
#endif
}

// The dot product of one weight row with x on the chosen path.
template <typename W>
float dot(const W* w, const float* x, int64_t n, bool simd) {
#ifdef MEGATON_GEMV_SIMD
  if (simd) return dot_simd(w, x, n);
#endif
  (void)simd;
  return dot_portable(w, x, n);
}

constexpr bool simd_compiled() {
#ifdef MEGATON_GEMV_SIMD
  return true;
#else
  return false;
#endif
}

}  // namespace megaton::kernels::cpu::gemv_detail
