// LayerNorm and RMSNorm over the last dimension. Backward split into input (B) and weight (W).
#pragma once
#include <cstdint>

namespace megaton::kernels::cpu {

// out = (x - mean) * rstd * weight + bias (bias may be null). mean/rstd: [N], saved for backward.
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* weight, const T* bias, int64_t N, int64_t C,
                       double eps);
template <typename T>
void layernorm_backward_input(T* dx, const T* dout, const T* x, const T* weight, const T* mean, const T* rstd,
                              int64_t N, int64_t C);
// dweight += sum_n dout * xhat; dbias += sum_n dout (dbias may be null).
template <typename T>
void layernorm_backward_weight(T* dweight, T* dbias, const T* dout, const T* x, const T* mean, const T* rstd,
                               int64_t N, int64_t C);

// out = x * rstd * weight, rstd = 1/sqrt(mean(x^2) + eps). rstd: [N].
template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* weight, int64_t N, int64_t C, double eps);
template <typename T>
void rmsnorm_backward_input(T* dx, const T* dout, const T* x, const T* weight, const T* rstd, int64_t N, int64_t C);
template <typename T>
void rmsnorm_backward_weight(T* dweight, const T* dout, const T* x, const T* rstd, int64_t N, int64_t C);

}  // namespace megaton::kernels::cpu
