// LayerNorm and RMSNorm over the last dimension on tensors; backward split into input (B) and
// weight (W). x, out, dout, dx: [..., C] with N = numel / C rows; weight, bias: [C]; mean, rstd:
// [N] statistics saved by forward for backward. Dispatches to kernels::cpu (f32 / f64, or bf16
// activations with f32 or bf16 weights) or kernels::cuda (f32 / bf16 activations, f32 / bf16
// weights; every form, the residual-fused ones included); bf16 activations are normalized in fp32
// with f32 statistics on both.
#pragma once
#include "megaton/kernels/exec_context.h"

namespace megaton::kernels {

// out = (x - mean) * rstd * weight + bias (bias may be undefined).
void layernorm_forward(const ExecContext& ctx, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                       const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
// The residual add fused into the norm after it (one pass over each row instead of two):
// sum = x + residual (sum may be x or residual), out = layernorm(sum).
void add_layernorm_forward(const ExecContext& ctx, const Tensor& sum, const Tensor& out, const Tensor& mean,
                           const Tensor& rstd, const Tensor& x, const Tensor& residual, const Tensor& weight,
                           const Tensor& bias, double eps);
// dx = the norm's input gradient, + dresidual when defined: the gradient of a residual stream x that
// feeds both the norm and the residual branch, added as dx is written instead of in a second pass.
void layernorm_backward_input(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x,
                              const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                              const Tensor& dresidual = {});
// dweight += sum_n dout * xhat; dbias += sum_n dout (dbias may be undefined).
void layernorm_backward_weight(const ExecContext& ctx, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                               const Tensor& x, const Tensor& mean, const Tensor& rstd);

// out = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps).
void rmsnorm_forward(const ExecContext& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x,
                     const Tensor& weight, double eps);
// sum = x + residual, out = rmsnorm(sum), as add_layernorm_forward.
void add_rmsnorm_forward(const ExecContext& ctx, const Tensor& sum, const Tensor& out, const Tensor& rstd,
                         const Tensor& x, const Tensor& residual, const Tensor& weight, double eps);
// dresidual as layernorm_backward_input's.
void rmsnorm_backward_input(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x,
                            const Tensor& weight, const Tensor& rstd, const Tensor& dresidual = {});
// dweight += sum_n dout * x * rstd.
void rmsnorm_backward_weight(const ExecContext& ctx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                             const Tensor& rstd);

}  // namespace megaton::kernels
