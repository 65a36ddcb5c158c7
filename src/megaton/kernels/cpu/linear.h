// Linear layer on cpu::gemm (OpenBLAS, or oneDNN for bf16 where the CPU has native bf16). Weights are
// [out, in] (PyTorch / HF layout). T is float, double or BFloat16; bf16 GEMMs accumulate in fp32.
#pragma once
#include <cstdint>

#include "megaton/core/dtype.h"

namespace megaton::kernels::cpu {

// out[N, out_f] = x[N, in_f] w^T (+ bias). The bias B is T, or f32 for bf16. One f32 / bf16 row
// (batch-1 decode) runs the streaming GEMV of cpu/gemv.h instead of a GEMM.
template <typename T, typename B>
void linear_forward(T* out, const T* x, const T* w, const B* bias, int64_t N, int64_t in_f, int64_t out_f);
// dx[N, in_f] = dout w
template <typename T>
void linear_backward_input(T* dx, const T* dout, const T* w, int64_t N, int64_t in_f, int64_t out_f);
// dw += dout^T x; dbias += sum_n dout (dbias may be null). The gradients G are T for f32 / f64 and f32
// for bf16 (Megatron's fp32 main_grad).
template <typename T, typename G>
void linear_backward_weight(G* dw, G* dbias, const T* dout, const T* x, int64_t N, int64_t in_f, int64_t out_f);
// dbias[C] += sum_n dout[n, :] (bitwise independent of the thread count); G as above.
template <typename T, typename G>
void bias_backward(G* dbias, const T* dout, int64_t N, int64_t C);

}  // namespace megaton::kernels::cpu
