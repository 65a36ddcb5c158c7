// CUDA softmax cross-entropy in the three forward kernels of kernels/cross_entropy.h (row max;
// sum-exp with the target logit of a vocabulary shard; loss) and the backward. logits / dlogits
// f32 or bf16, every per-row statistic f32, targets i32 (kIgnoreIndex rows: loss 0, lse 0, zero
// gradient). One block per row for the row kernels, reduced by a fixed tree (deterministic).
// Shapes and dtypes were checked by kernels/cross_entropy.cpp.
#pragma once
#include "megaton/kernels/exec_context.h"

namespace megaton::kernels::cuda {

void cross_entropy_row_max(const ExecContext& ctx, const Tensor& row_max, const Tensor& logits, int64_t N, int64_t V);
void cross_entropy_sum_exp(const ExecContext& ctx, const Tensor& sum_exp, const Tensor& target_logit,
                           const Tensor& logits, const Tensor& row_max, const Tensor& targets, int64_t vocab_start,
                           int64_t N, int64_t V);
void cross_entropy_loss(const ExecContext& ctx, const Tensor& loss, const Tensor& lse, const Tensor& row_max,
                        const Tensor& sum_exp, const Tensor& target_logit, const Tensor& targets, int64_t N);
// dlogits may be logits (in place).
void cross_entropy_backward(const ExecContext& ctx, const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                            const Tensor& targets, int64_t vocab_start, double grad_scale, int64_t N, int64_t V);

}  // namespace megaton::kernels::cuda
