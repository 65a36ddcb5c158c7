// Softmax cross-entropy over the vocabulary on tensors, fused: the softmax is never materialised;
// forward keeps the log-sum-exp per row and backward rebuilds probabilities from logits and lse.
// logits / dlogits [N, V]; loss, lse [N]; targets i32 [N] (kIgnoreIndex: no loss, zero gradient).
// Dispatches to kernels::cpu (f32 / f64, every tensor one dtype) or kernels::cuda (logits / dlogits
// f32 or bf16, loss and lse f32).
#pragma once
#include "megaton/kernels/exec_context.h"
#include "megaton/kernels/ignore_index.h"

namespace megaton::kernels {

// loss[n] = lse[n] - logits[n, target[n]].
void cross_entropy_forward(const ExecContext& ctx, const Tensor& loss, const Tensor& lse, const Tensor& logits,
                           const Tensor& targets);
// dlogits[n] = grad_scale * (softmax(logits[n]) - onehot(target[n])); dlogits may be logits.
void cross_entropy_backward(const ExecContext& ctx, const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                            const Tensor& targets, double grad_scale);

}  // namespace megaton::kernels
