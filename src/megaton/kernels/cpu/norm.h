// LayerNorm and RMSNorm over the last dimension. Backward split into input (B) and weight (W).
// Activations T (float, double or BFloat16) with parameters W (the same type, or float or BFloat16
// for bf16 activations); the mean / rstd statistics are compute_t<T> (f32 for bf16) and all math
// is done in compute_t<T> or wider.
#pragma once
#include <cstdint>

#include "megaton/kernels/cpu/element.h"

namespace megaton::kernels::cpu {

// out = (x - mean) * rstd * weight + bias (bias may be null). mean/rstd: [N], saved for backward.
template <typename T, typename W>
void layernorm_forward(T* out, compute_t<T>* mean, compute_t<T>* rstd, const T* x, const W* weight, const W* bias,
                       int64_t N, int64_t C, double eps);
// The residual add fused into the norm after it: sum = x + residual (sum may alias x or residual),
// then out = layernorm(sum), in one pass over each row.
template <typename T, typename W>
void add_layernorm_forward(T* sum, T* out, compute_t<T>* mean, compute_t<T>* rstd, const T* x, const T* residual,
                           const W* weight, const W* bias, int64_t N, int64_t C, double eps);
// dx = the norm's input gradient, plus dresidual (the residual stream's gradient) when it is not null.
template <typename T, typename W>
void layernorm_backward_input(T* dx, const T* dout, const T* x, const W* weight, const compute_t<T>* mean,
                              const compute_t<T>* rstd, int64_t N, int64_t C, const T* dresidual = nullptr);
// dweight += sum_n dout * xhat; dbias += sum_n dout (dbias may be null).
template <typename T, typename W>
void layernorm_backward_weight(W* dweight, W* dbias, const T* dout, const T* x, const compute_t<T>* mean,
                               const compute_t<T>* rstd, int64_t N, int64_t C);

// out = x * rstd * weight, rstd = 1/sqrt(mean(x^2) + eps). rstd: [N].
template <typename T, typename W>
void rmsnorm_forward(T* out, compute_t<T>* rstd, const T* x, const W* weight, int64_t N, int64_t C, double eps);
template <typename T, typename W>
void add_rmsnorm_forward(T* sum, T* out, compute_t<T>* rstd, const T* x, const T* residual, const W* weight, int64_t N,
                         int64_t C, double eps);
template <typename T, typename W>
void rmsnorm_backward_input(T* dx, const T* dout, const T* x, const W* weight, const compute_t<T>* rstd, int64_t N,
                            int64_t C, const T* dresidual = nullptr);
template <typename T, typename W>
void rmsnorm_backward_weight(W* dweight, const T* dout, const T* x, const compute_t<T>* rstd, int64_t N, int64_t C);

// The fused FP8 forms (kernels/fp8_sources.h). norm_statistics: the mean (null for RMSNorm) and
// rstd the forward saves, after sum = x + residual when residual is not null, without the output.
// normalize_block_f32: the output of rows [r0, r1) x columns [c0, c1) from those statistics, in f32
// into out (row stride ld, from (r0, c0)): the forward's values before their rounding to T.
// T: float or BFloat16.
template <typename T>
void norm_statistics(T* sum, compute_t<T>* mean, compute_t<T>* rstd, const T* x, const T* residual, int64_t N,
                     int64_t C, double eps);
template <typename T, typename W>
void normalize_block_f32(float* out, int64_t ld, const T* x, const compute_t<T>* mean, const compute_t<T>* rstd,
                         const W* weight, const W* bias, int64_t C, int64_t r0, int64_t r1, int64_t c0, int64_t c1);

}  // namespace megaton::kernels::cpu
