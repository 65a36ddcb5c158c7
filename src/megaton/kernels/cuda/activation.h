// CUDA pointwise activations, f32 or bf16 tensors computed in fp32: GeLU (tanh approximation) and
// SwiGLU (gu = [gate | up] rows of 2H, out rows of H: silu(gate) * up), forward and backward, with
// or without the fused bias, and the residual add. Shapes were checked by the dispatcher in kernels/activation.cpp.
#pragma once
#include "megaton/kernels/exec_context.h"

namespace megaton::kernels::cuda {

void gelu_forward(const ExecContext& ctx, const Tensor& out, const Tensor& x);
void gelu_backward(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x);
void swiglu_forward(const ExecContext& ctx, const Tensor& out, const Tensor& gu, int64_t N, int64_t H);
void swiglu_backward(const ExecContext& ctx, const Tensor& dgu, const Tensor& dout, const Tensor& gu, int64_t N,
                     int64_t H);
// The bias of the GEMM before the activation fused into it (f32 bias and dbias, [F] / [2H]); the
// backward sums each column's stored gradients into dbias, rows in order (deterministic).
void bias_gelu_forward(const ExecContext& ctx, const Tensor& out, const Tensor& h, const Tensor& bias, int64_t F);
void bias_gelu_backward(const ExecContext& ctx, const Tensor& dh, const Tensor& dbias, const Tensor& dout,
                        const Tensor& h, const Tensor& bias, int64_t F);
void bias_swiglu_forward(const ExecContext& ctx, const Tensor& out, const Tensor& gu, const Tensor& bias, int64_t N,
                         int64_t H);
void bias_swiglu_backward(const ExecContext& ctx, const Tensor& dgu, const Tensor& dbias, const Tensor& dout,
                          const Tensor& gu, const Tensor& bias, int64_t N, int64_t H);
void residual_forward(const ExecContext& ctx, const Tensor& out, const Tensor& a, const Tensor& b);

}  // namespace megaton::kernels::cuda
