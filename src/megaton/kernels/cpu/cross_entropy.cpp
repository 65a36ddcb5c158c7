#include "megaton/kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "megaton/kernels/cpu/element.h"
#include "megaton/kernels/cpu/fast_exp.h"

namespace megaton::kernels::cpu {
namespace {

using detail::fast_exp;

// sum_v exp(x[v] - mx). The sum of up to ~10^5 terms in (0, 1] is kept in double across chunks so
// the vocabulary size does not cost float precision; within a chunk 16 partial sums in T each add
// every 16th term (at most 16 terms each for kChunk = 256). The order is spelled out rather than
// left to the vectoriser, so 16-bit logits give bit for bit what their f32 widening gives.
// (GCC does not vectorise the exp loop with a double accumulator directly.)
template <typename L, typename T = compute_t<L>>
double row_sum_exp(const L* x, T mx, int64_t V) {
  constexpr int64_t kChunk = 256, kLanes = 16;
  double sum = 0.0;
  for (int64_t v0 = 0; v0 < V; v0 += kChunk) {
    const int64_t v1 = std::min(V, v0 + kChunk);
    T lanes[kLanes] = {};
    int64_t v = v0;
    for (; v + kLanes <= v1; v += kLanes) {
#pragma omp simd
      for (int64_t l = 0; l < kLanes; ++l) lanes[l] += fast_exp(load(x[v + l]) - mx);
    }
    for (; v < v1; ++v) lanes[(v - v0) % kLanes] += fast_exp(load(x[v]) - mx);
    T part = 0;
    for (T lane : lanes) part += lane;
    sum += part;
  }
  return sum;
}

}  // namespace

template <typename L, typename T>
void cross_entropy_row_max(T* row_max, const L* logits, int64_t N, int64_t V) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const L* x = logits + n * V;
    T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t v = 0; v < V; ++v) {
      const T xv = load(x[v]);
      mx = xv > mx ? xv : mx;
    }
    row_max[n] = mx;
  }
}

template <typename L, typename T>
void cross_entropy_sum_exp(T* sum_exp, T* target_logit, const L* logits, const T* row_max, const int32_t* targets,
                           int64_t vocab_start, int64_t N, int64_t V) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const L* x = logits + n * V;
    sum_exp[n] = static_cast<T>(row_sum_exp(x, row_max[n], V));
    const int64_t local = static_cast<int64_t>(targets[n]) - vocab_start;
    target_logit[n] = targets[n] != kIgnoreIndex && local >= 0 && local < V ? T(load(x[local])) : T(0);
  }
}

template <typename T>
void cross_entropy_loss(T* loss, T* lse, const T* row_max, const T* sum_exp, const T* target_logit,
                        const int32_t* targets, int64_t N) {
  for (int64_t n = 0; n < N; ++n) {
    const bool ignored = targets[n] == kIgnoreIndex;
    lse[n] = ignored ? T(0) : row_max[n] + std::log(sum_exp[n]);
    loss[n] = ignored ? T(0) : lse[n] - target_logit[n];
  }
}

template <typename L, typename T>
void cross_entropy_backward(L* dlogits, const L* logits, const T* lse, const int32_t* targets, int64_t vocab_start,
                            T grad_scale, int64_t N, int64_t V) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const L* x = logits + n * V;
    L* dx = dlogits + n * V;
    if (targets[n] == kIgnoreIndex) {
#pragma omp simd
      for (int64_t v = 0; v < V; ++v) dx[v] = store<L>(T(0));
      continue;
    }
    const T row_lse = lse[n];
    const int64_t target = static_cast<int64_t>(targets[n]) - vocab_start;  // outside [0, V): not in this shard
    // Each element is read before it is written, so dlogits == logits is safe under simd.
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) {
      const T onehot = v == target ? T(1) : T(0);
      dx[v] = store<L>(grad_scale * (fast_exp(load(x[v]) - row_lse) - onehot));
    }
  }
}

template void cross_entropy_loss<float>(float*, float*, const float*, const float*, const float*, const int32_t*,
                                        int64_t);
template void cross_entropy_loss<double>(double*, double*, const double*, const double*, const double*,
                                         const int32_t*, int64_t);
#define MEGATON_INSTANTIATE_CE(L)                                                                                  \
  template void cross_entropy_row_max<L>(compute_t<L>*, const L*, int64_t, int64_t);                                \
  template void cross_entropy_sum_exp<L>(compute_t<L>*, compute_t<L>*, const L*, const compute_t<L>*, const int32_t*, \
                                         int64_t, int64_t, int64_t);                                               \
  template void cross_entropy_backward<L>(L*, const L*, const compute_t<L>*, const int32_t*, int64_t, compute_t<L>,   \
                                          int64_t, int64_t);
MEGATON_INSTANTIATE_CE(float)
MEGATON_INSTANTIATE_CE(double)
MEGATON_INSTANTIATE_CE(BFloat16)
MEGATON_INSTANTIATE_CE(Float16)
#undef MEGATON_INSTANTIATE_CE

}  // namespace megaton::kernels::cpu
