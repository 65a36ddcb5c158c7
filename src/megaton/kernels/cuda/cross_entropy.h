// CUDA softmax cross-entropy, fused (no softmax stored): logits / dlogits f32 or bf16, loss and lse
// always f32, targets i32 (kIgnoreIndex rows: loss 0, lse 0, zero gradient). One block per row;
// the row's max and sum of exponentials come from a fixed-order block reduction (deterministic).
// Shapes were checked by kernels/cross_entropy.cpp.
#pragma once
#include "megaton/kernels/exec_context.h"

namespace megaton::kernels::cuda {

void cross_entropy_forward(const ExecContext& ctx, const Tensor& loss, const Tensor& lse, const Tensor& logits,
                           const Tensor& targets, int64_t N, int64_t V);
// dlogits may be logits (in place).
void cross_entropy_backward(const ExecContext& ctx, const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                            const Tensor& targets, double grad_scale, int64_t N, int64_t V);

}  // namespace megaton::kernels::cuda
