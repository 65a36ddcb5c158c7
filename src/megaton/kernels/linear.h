// Linear layer y = x W^T (+ b) on tensors, forward and the two halves of backward. Weights are
// [out, in] (PyTorch / HF layout); activations [..., features] with rows = numel / features.
// Dispatches on the device: kernels::cpu (f32 / f64 on OpenBLAS; bf16 on oneDNN or OpenBLAS, see
// cpu/gemm.h; the forward of a single f32 / bf16 row, batch-1 decode, on the streaming GEMV of
// cpu/gemv.h) or kernels::cuda (cuBLASLt, f32 / bf16). bf16 GEMMs accumulate in fp32; the bias of a
// bf16 linear may be f32 or bf16 on the cpu (bf16 on CUDA); its weight gradient dw (and dbias)
// accumulates into f32 (CUDA also takes a bf16 dw).
#pragma once
#include "megaton/kernels/exec_context.h"

namespace megaton::kernels {

// out[N, out] = x[N, in] w^T + bias (bias may be undefined).
void linear_forward(const ExecContext& ctx, const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias);
// dx[N, in] = dout[N, out] w (written).
void linear_backward_input(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& w);
// dw[out, in] += dout^T x; dbias[out] += sum over rows of dout (dbias may be undefined).
void linear_backward_weight(const ExecContext& ctx, const Tensor& dw, const Tensor& dbias, const Tensor& dout,
                            const Tensor& x);

// dbias[out] += sum over rows of dout (f32 dbias for bf16 dout): the bias half of
// linear_backward_weight, for GEMMs that run elsewhere (FP8).
void bias_backward(const ExecContext& ctx, const Tensor& dbias, const Tensor& dout);

}  // namespace megaton::kernels
