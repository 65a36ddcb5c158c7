// CUDA LayerNorm and RMSNorm, one kernel family for both (an undefined mean is RMSNorm: no centering,
// no bias): x / out / dout / dx / sum / residual in f32 or bf16, weight, bias and their gradients f32
// or bf16, the mean and rstd statistics always f32; every sum in fp32 over a fixed order
// (deterministic). Shapes were checked by the dispatcher in kernels/norm.cpp.
#pragma once
#include "megaton/kernels/exec_context.h"

namespace megaton::kernels::cuda {

// With residual defined, sum = x + residual first (sum may alias x or residual) and the norm is of
// that sum; out = (v - mean) * rstd * weight (+ bias).
void norm_forward(const ExecContext& ctx, const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                  const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias, double eps,
                  int64_t N, int64_t C);
// dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dout * weight (the mean(g) term only for
// LayerNorm), + dresidual when defined.
void norm_backward_input(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x,
                         const Tensor& weight, const Tensor& mean, const Tensor& rstd, const Tensor& dresidual,
                         int64_t N, int64_t C);
// dweight += sum_n dout * xhat; dbias += sum_n dout when defined.
void norm_backward_weight(const ExecContext& ctx, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                          const Tensor& x, const Tensor& mean, const Tensor& rstd, int64_t N, int64_t C);

}  // namespace megaton::kernels::cuda
