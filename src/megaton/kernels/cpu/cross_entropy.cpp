#include "megaton/kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "megaton/kernels/cpu/fast_exp.h"

namespace megaton::kernels::cpu {
namespace {

using detail::fast_exp;

// log(sum_v exp(x[v])), shifted by the row max so no term overflows. The sum of up to ~10^5 terms in
// (0, 1] is kept in double across chunks so the vocabulary size does not cost float precision;
// within a chunk each SIMD lane adds only 16 (float) or 32 (double) terms in T. (GCC does not
// vectorise the exp loop with a double accumulator directly.)
template <typename T>
T row_logsumexp(const T* x, int64_t V) {
  constexpr int64_t kChunk = 256;
  T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t v = 0; v < V; ++v) mx = x[v] > mx ? x[v] : mx;
  double sum = 0.0;
  for (int64_t v0 = 0; v0 < V; v0 += kChunk) {
    const int64_t v1 = std::min(V, v0 + kChunk);
    T part = 0;
#pragma omp simd reduction(+ : part)
    for (int64_t v = v0; v < v1; ++v) part += fast_exp(x[v] - mx);
    sum += part;
  }
  return mx + static_cast<T>(std::log(sum));
}

}  // namespace

template <typename T>
void cross_entropy_forward(T* loss, T* lse, const T* logits, const int32_t* targets, int64_t N, int64_t V) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == kIgnoreIndex) {
      loss[n] = T(0);
      lse[n] = T(0);
      continue;
    }
    const T* x = logits + n * V;
    lse[n] = row_logsumexp(x, V);
    loss[n] = lse[n] - x[targets[n]];
  }
}

template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const T* lse, const int32_t* targets, T grad_scale, int64_t N,
                            int64_t V) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * V;
    T* dx = dlogits + n * V;
    const int64_t target = targets[n];
    if (target == kIgnoreIndex) {
#pragma omp simd
      for (int64_t v = 0; v < V; ++v) dx[v] = T(0);
      continue;
    }
    const T row_lse = lse[n];
    // Each element is read before it is written, so dlogits == logits is safe under simd.
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) {
      const T onehot = v == target ? T(1) : T(0);
      dx[v] = grad_scale * (fast_exp(x[v] - row_lse) - onehot);
    }
  }
}

template void cross_entropy_forward<float>(float*, float*, const float*, const int32_t*, int64_t, int64_t);
template void cross_entropy_forward<double>(double*, double*, const double*, const int32_t*, int64_t, int64_t);
template void cross_entropy_backward<float>(float*, const float*, const float*, const int32_t*, float, int64_t,
                                            int64_t);
template void cross_entropy_backward<double>(double*, const double*, const double*, const int32_t*, double, int64_t,
                                             int64_t);

}  // namespace megaton::kernels::cpu
