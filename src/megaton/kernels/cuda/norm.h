// CUDA RMSNorm: x / out / dout / dx in f32 or bf16, weight and its gradient f32 or bf16, the rstd
// statistics always f32; every sum in fp32 over a fixed order (deterministic).
#pragma once
#include "megaton/kernels/exec_context.h"

namespace megaton::kernels::cuda {

void rmsnorm_forward(const ExecContext& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x,
                     const Tensor& weight, double eps, int64_t N, int64_t C);
void rmsnorm_backward_input(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x,
                            const Tensor& weight, const Tensor& rstd, int64_t N, int64_t C);
void rmsnorm_backward_weight(const ExecContext& ctx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                             const Tensor& rstd, int64_t N, int64_t C);

}  // namespace megaton::kernels::cuda
