// Linear layer on OpenBLAS GEMM. Weights are [out, in] (PyTorch / HF layout).
#pragma once
#include <cstdint>

namespace megaton::kernels::cpu {

// out[N, out_f] = x[N, in_f] w^T (+ bias).
template <typename T>
void linear_forward(T* out, const T* x, const T* w, const T* bias, int64_t N, int64_t in_f, int64_t out_f);
// dx[N, in_f] = dout w
template <typename T>
void linear_backward_input(T* dx, const T* dout, const T* w, int64_t N, int64_t in_f, int64_t out_f);
// dw += dout^T x; dbias += sum_n dout (dbias may be null)
template <typename T>
void linear_backward_weight(T* dw, T* dbias, const T* dout, const T* x, int64_t N, int64_t in_f, int64_t out_f);

}  // namespace megaton::kernels::cpu
