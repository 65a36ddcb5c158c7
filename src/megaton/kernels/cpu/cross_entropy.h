// Softmax cross-entropy over the vocabulary: the softmax is never materialised; forward keeps the
// log-sum-exp per row and backward rebuilds probabilities from logits and lse.
//
// The forward is three kernels so that a vocabulary split over ranks (Megatron's vocab-parallel
// cross-entropy) only inserts reductions between them: the MAX of row_max over the shards after
// the first, the SUM of sum_exp and of target_logit after the second. Each shard's logits hold
// the vocabulary entries [vocab_start, vocab_start + V); unsplit, vocab_start is 0.
#pragma once
#include <cstdint>

#include "megaton/kernels/cpu/element.h"
#include "megaton/kernels/ignore_index.h"

namespace megaton::kernels::cpu {

// L, the logits' storage: f32 or f64, or bf16 / fp16 (Megatron's upcast: each logit is widened to
// fp32 as it is read, the statistics T = compute_t<L> are fp32, and the gradient is rounded to L as
// it is written, so no fp32 copy of the logits exists).

// row_max[n] = max_v logits[n, v].
template <typename L, typename T = compute_t<L>>
void cross_entropy_row_max(T* row_max, const L* logits, int64_t N, int64_t V);

// sum_exp[n] = sum_v exp(logits[n, v] - row_max[n]); target_logit[n] = logits[n, target[n] -
// vocab_start] when the target falls in this shard, else 0.
template <typename L, typename T = compute_t<L>>
void cross_entropy_sum_exp(T* sum_exp, T* target_logit, const L* logits, const T* row_max, const int32_t* targets,
                           int64_t vocab_start, int64_t N, int64_t V);

// lse[n] = row_max[n] + log(sum_exp[n]); loss[n] = lse[n] - target_logit[n]; both 0 for ignored rows.
template <typename T>
void cross_entropy_loss(T* loss, T* lse, const T* row_max, const T* sum_exp, const T* target_logit,
                        const int32_t* targets, int64_t N);

// dlogits[n, :] = grad_scale * (softmax(logits[n]) - onehot(target[n] - vocab_start)); zero for
// ignored rows. dlogits may alias logits (in-place backward).
template <typename L, typename T = compute_t<L>>
void cross_entropy_backward(L* dlogits, const L* logits, const T* lse, const int32_t* targets, int64_t vocab_start,
                            T grad_scale, int64_t N, int64_t V);

}  // namespace megaton::kernels::cpu
