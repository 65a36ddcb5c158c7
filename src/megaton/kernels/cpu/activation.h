// Pointwise activations and the residual add. T is float, double or BFloat16 (computed in fp32).
#pragma once
#include <cstdint>

#include "megaton/kernels/cpu/element.h"

namespace megaton::kernels::cpu {

// GeLU, tanh approximation (GPT-2's "gelu_new"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <typename T>
void gelu_forward(T* out, const T* x, int64_t n);
template <typename T>
void gelu_backward(T* dx, const T* dout, const T* x, int64_t n);

// SwiGLU on a fused [gate | up] input (Megatron's linear_fc1 layout): gu is [N, 2H] with the
// gate in columns [0, H) and up in [H, 2H); out[N, H] = silu(gate) * up.
template <typename T>
void swiglu_forward(T* out, const T* gu, int64_t N, int64_t H);
template <typename T>
void swiglu_backward(T* dgu, const T* dout, const T* gu, int64_t N, int64_t H);

// The bias of the GEMM before the activation, fused into it (Megatron's bias_activation_fusion):
// the GEMM writes h without its bias, forward computes act(h + bias) and backward recomputes
// h + bias, writes dh and adds its column sums into dbias in the same pass. h and dh: [N, F] for
// GeLU, [N, 2H] ([gate | up]) for SwiGLU; bias, dbias: [F] / [2H] in compute_t<T> (f32 for bf16).
// dbias is summed over the rows in order per element (threads split the columns): bitwise
// thread-count free, and bitwise what bias_backward would add from the stored dh.
template <typename T>
void bias_gelu_forward(T* out, const T* h, const compute_t<T>* bias, int64_t N, int64_t F);
template <typename T>
void bias_gelu_backward(T* dh, compute_t<T>* dbias, const T* dout, const T* h, const compute_t<T>* bias, int64_t N,
                        int64_t F);
template <typename T>
void bias_swiglu_forward(T* out, const T* gu, const compute_t<T>* bias, int64_t N, int64_t H);
template <typename T>
void bias_swiglu_backward(T* dgu, compute_t<T>* dbias, const T* dout, const T* gu, const compute_t<T>* bias, int64_t N,
                          int64_t H);

// The forward's output of rows [r0, r1) x columns [c0, c1) in f32, into out (row stride ld, from
// r0 and c0): what gelu / swiglu (bias_* with bias) store, before the rounding to T. The FP8
// producer of LayerNormMLP's fc2 input (kernels/fp8_sources.h). F: output columns. T: float or
// BFloat16.
template <typename T>
void activation_block_f32(float* out, int64_t ld, const T* h, const compute_t<T>* bias, bool swiglu, int64_t F,
                          int64_t r0, int64_t r1, int64_t c0, int64_t c1);

// out = a + b (out may alias a or b). Its backward needs no kernel: both inputs receive dy.
template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n);

}  // namespace megaton::kernels::cpu
