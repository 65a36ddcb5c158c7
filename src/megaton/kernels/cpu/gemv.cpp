#include "megaton/kernels/cpu/gemv.h"

#include <vector>

#include "megaton/core/error.h"
#include "megaton/kernels/cpu/element.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MEGATON_GEMV_SIMD 1
#endif

namespace megaton::kernels::cpu {
namespace {

// Below this many weight elements one thread finishes before a parallel region would start.
constexpr int64_t kParallelMin = 1 << 15;

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

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

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
#endif

template <typename T, typename W, typename B>
void gemv_rows(T* y, const float* x, const W* w, const B* bias, int64_t in_f, int64_t out_f, bool simd) {
  const auto dot = [&](int64_t r) {
#ifdef MEGATON_GEMV_SIMD
    if (simd) return dot_simd(w + r * in_f, x, in_f);
#endif
    return dot_portable(w + r * in_f, x, in_f);
  };
#pragma omp parallel for schedule(static) if (out_f * in_f >= kParallelMin)
  for (int64_t r = 0; r < out_f; ++r) y[r] = store<T>(dot(r) + (bias ? static_cast<float>(load(bias[r])) : 0.0f));
}

}  // namespace

bool gemv_simd_compiled() {
#ifdef MEGATON_GEMV_SIMD
  return true;
#else
  return false;
#endif
}

template <typename T, typename W, typename B>
void gemv(T* y, const T* x, const W* w, const B* bias, int64_t in_f, int64_t out_f, GemvPath path) {
  if (path == GemvPath::Simd && !gemv_simd_compiled())
    fail("gemv: the AVX2/FMA path was not compiled in (build for a CPU with AVX2, MEGATON_NATIVE=ON)");
  const bool simd = path != GemvPath::Portable && gemv_simd_compiled();
  // x is read by every row: widen it once (a bf16 x) so the inner loops load fp32 from L1.
  std::vector<float> xf(static_cast<size_t>(in_f));
  for (int64_t i = 0; i < in_f; ++i) xf[static_cast<size_t>(i)] = load(x[i]);
  gemv_rows(y, xf.data(), w, bias, in_f, out_f, simd);
}

template void gemv<float, float, float>(float*, const float*, const float*, const float*, int64_t, int64_t, GemvPath);
template void gemv<float, BFloat16, float>(float*, const float*, const BFloat16*, const float*, int64_t, int64_t,
                                           GemvPath);
template void gemv<BFloat16, BFloat16, BFloat16>(BFloat16*, const BFloat16*, const BFloat16*, const BFloat16*, int64_t,
                                                 int64_t, GemvPath);
template void gemv<BFloat16, BFloat16, float>(BFloat16*, const BFloat16*, const BFloat16*, const float*, int64_t,
                                              int64_t, GemvPath);

}  // namespace megaton::kernels::cpu
