// Pointwise activations and the residual add on tensors. Shapes: GeLU and the residual add work
// on any shape (out, x, dout, dx alike); SwiGLU takes the fused [gate | up] input gu [..., 2H]
// (Megatron's linear_fc1 layout) and gives out [..., H]. Dispatches to kernels::cpu (f32 / f64 /
// bf16) or kernels::cuda (every op here: f32 / bf16); bf16 is computed in fp32 on both.
#pragma once
#include "megaton/kernels/exec_context.h"

namespace megaton::kernels {

// GeLU, tanh approximation (GPT-2's "gelu_new"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(const ExecContext& ctx, const Tensor& out, const Tensor& x);
void gelu_backward(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x);

// out = silu(gate) * up.
void swiglu_forward(const ExecContext& ctx, const Tensor& out, const Tensor& gu);
void swiglu_backward(const ExecContext& ctx, const Tensor& dgu, const Tensor& dout, const Tensor& gu);

// The bias of the GEMM before the activation, fused into the activation (Megatron's
// bias_activation_fusion): the GEMM writes h without its bias, forward computes
// act(h + bias), and backward recomputes h + bias, writes dh and adds its column sums into dbias in
// the same pass, instead of a bias pass in the GEMM and another over dh in its weight gradient.
// h, dh: [..., F] for GeLU and [..., 2H] ([gate | up]) for SwiGLU; bias, dbias: [F] / [2H], f32 for
// f32, bf16 and fp16 activations (f64 for f64).
void bias_gelu_forward(const ExecContext& ctx, const Tensor& out, const Tensor& h, const Tensor& bias);
void bias_gelu_backward(const ExecContext& ctx, const Tensor& dh, const Tensor& dbias, const Tensor& dout,
                        const Tensor& h, const Tensor& bias);
void bias_swiglu_forward(const ExecContext& ctx, const Tensor& out, const Tensor& gu, const Tensor& bias);
void bias_swiglu_backward(const ExecContext& ctx, const Tensor& dgu, const Tensor& dbias, const Tensor& dout,
                          const Tensor& gu, const Tensor& bias);

// out = a + b (out may be a or b). Its backward needs no kernel: both inputs receive dy.
void residual_forward(const ExecContext& ctx, const Tensor& out, const Tensor& a, const Tensor& b);

}  // namespace megaton::kernels
