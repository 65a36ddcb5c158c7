// Softmax cross-entropy over the vocabulary, fused: the softmax is never materialised; forward
// keeps the log-sum-exp per row and backward rebuilds probabilities from logits and lse.
#pragma once
#include <cstdint>

#include "megaton/kernels/ignore_index.h"

namespace megaton::kernels::cpu {

// loss[n] = lse[n] - logits[n, target[n]] (0 for ignored rows).
template <typename T>
void cross_entropy_forward(T* loss, T* lse, const T* logits, const int32_t* targets, int64_t N, int64_t V);

// dlogits[n, :] = grad_scale * (softmax(logits[n]) - onehot(target[n])); zero for ignored rows.
// dlogits may alias logits (in-place backward).
template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const T* lse, const int32_t* targets, T grad_scale, int64_t N,
                            int64_t V);

}  // namespace megaton::kernels::cpu
