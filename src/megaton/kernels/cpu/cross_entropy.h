// Softmax cross-entropy over the vocabulary: the softmax is never materialised; forward keeps the
// log-sum-exp per row and backward rebuilds probabilities from logits and lse.
//
// The forward is three kernels so that a vocabulary split over ranks (Megatron's vocab-parallel
// cross-entropy) only inserts reductions between them: the MAX of row_max over the shards after
// the first, the SUM of sum_exp and of target_logit after the second. Each shard's logits hold
// the vocabulary entries [vocab_start, vocab_start + V); unsplit, vocab_start is 0.
#pragma once
#include <cstdint>

#include "megaton/kernels/ignore_index.h"

namespace megaton::kernels::cpu {

// row_max[n] = max_v logits[n, v].
template <typename T>
void cross_entropy_row_max(T* row_max, const T* logits, int64_t N, int64_t V);

// sum_exp[n] = sum_v exp(logits[n, v] - row_max[n]); target_logit[n] = logits[n, target[n] -
// vocab_start] when the target falls in this shard, else 0.
template <typename T>
void cross_entropy_sum_exp(T* sum_exp, T* target_logit, const T* logits, const T* row_max, const int32_t* targets,
                           int64_t vocab_start, int64_t N, int64_t V);

// lse[n] = row_max[n] + log(sum_exp[n]); loss[n] = lse[n] - target_logit[n]; both 0 for ignored rows.
template <typename T>
void cross_entropy_loss(T* loss, T* lse, const T* row_max, const T* sum_exp, const T* target_logit,
                        const int32_t* targets, int64_t N);

// dlogits[n, :] = grad_scale * (softmax(logits[n]) - onehot(target[n] - vocab_start)); zero for
// ignored rows. dlogits may alias logits (in-place backward).
template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const T* lse, const int32_t* targets, int64_t vocab_start,
                            T grad_scale, int64_t N, int64_t V);

}  // namespace megaton::kernels::cpu
