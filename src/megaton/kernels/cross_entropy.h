// Softmax cross-entropy over the vocabulary on tensors: the softmax is never materialised; forward
// keeps the log-sum-exp per row and backward rebuilds probabilities from logits and lse.
// logits / dlogits [N, V]; every per-row statistic [N], f64 for f64 logits and f32 otherwise;
// targets i32 [N] (kIgnoreIndex: no loss, zero gradient). Dispatches to kernels::cpu (logits f32,
// f64, bf16 or fp16; bf16 / fp16 widened to fp32 as read, gradients rounded back as written) or
// kernels::cuda (logits f32 or bf16).
//
// The forward is three kernels with the reduction points between them explicit, so that
// vocab-parallel cross-entropy (each rank holding vocabulary entries [vocab_start, vocab_start +
// V)) only adds all-reduces: MAX of row_max after cross_entropy_row_max, SUM of sum_exp and
// target_logit after cross_entropy_sum_exp. Unsplit, vocab_start is 0 and nothing is reduced.
#pragma once
#include "megaton/kernels/exec_context.h"
#include "megaton/kernels/ignore_index.h"

namespace megaton::kernels {

// row_max[n] = max_v logits[n, v].
void cross_entropy_row_max(const ExecContext& ctx, const Tensor& row_max, const Tensor& logits);
// sum_exp[n] = sum_v exp(logits[n, v] - row_max[n]); target_logit[n] = logits[n, targets[n] -
// vocab_start] where the target is in this shard, else 0.
void cross_entropy_sum_exp(const ExecContext& ctx, const Tensor& sum_exp, const Tensor& target_logit,
                           const Tensor& logits, const Tensor& row_max, const Tensor& targets, int64_t vocab_start);
// lse = row_max + log(sum_exp); loss = lse - target_logit (both 0 for ignored rows).
void cross_entropy_loss(const ExecContext& ctx, const Tensor& loss, const Tensor& lse, const Tensor& row_max,
                        const Tensor& sum_exp, const Tensor& target_logit, const Tensor& targets);
// dlogits[n] = grad_scale * (softmax(logits[n]) - onehot(targets[n] - vocab_start)); dlogits may be
// logits.
void cross_entropy_backward(const ExecContext& ctx, const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                            const Tensor& targets, int64_t vocab_start, double grad_scale);

}  // namespace megaton::kernels
