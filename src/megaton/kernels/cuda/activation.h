// CUDA GeLU (tanh approximation), forward and backward, f32 or bf16 tensors computed in fp32.
#pragma once
#include "megaton/kernels/exec_context.h"

namespace megaton::kernels::cuda {

void gelu_forward(const ExecContext& ctx, const Tensor& out, const Tensor& x);
void gelu_backward(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x);

}  // namespace megaton::kernels::cuda
