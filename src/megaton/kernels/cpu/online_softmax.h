// The online (flash) softmax step shared by the CPU attention kernels: the training forward's
// query x key tiles (attention.cpp) and batch-1 decode's blocks of cached keys (decode_attention.cpp).
#pragma once
#include <cstdint>

#include "megaton/kernels/cpu/fast_exp.h"

namespace megaton::kernels::cpu {

// Folds a block of scores into each row's running softmax: s holds `rows` rows of `cols` scores,
// `stride` apart; m is the running max, l the running sum of exp(s - m) and acc[D] the running sum
// of exp(s - m) v. Rescales l and acc to the new max and leaves exp(s - m_new) in s, ready to be
// multiplied with V.
template <typename T>
void online_softmax_step(T* s, int64_t stride, int64_t cols, T* m, T* l, T* acc, int64_t rows, int64_t D) {
  for (int64_t i = 0; i < rows; ++i) {
    T* si = s + i * stride;
    T mx = m[i];
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < cols; ++j) mx = si[j] > mx ? si[j] : mx;
    const T correction = detail::fast_exp(m[i] - mx);  // 0 on the first block, where m = -inf
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < cols; ++j) {
      si[j] = detail::fast_exp(si[j] - mx);
      sum += si[j];
    }
    l[i] = l[i] * correction + sum;
    m[i] = mx;
    T* ai = acc + i * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) ai[d] *= correction;
  }
}

}  // namespace megaton::kernels::cpu
