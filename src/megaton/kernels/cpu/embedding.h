// Token + learned position embedding.
#pragma once
#include <cstdint>

namespace megaton::kernels::cpu {

// out[b,t,:] = wte[tokens[b,t],:] + (wpe ? wpe[t,:] : 0). tokens must be < vocab (checked by caller).
// The table W is T, or bf16 beside f32 rows (a bf16-only inference model's table, widened exactly).
template <typename T, typename W = T>
void embedding_forward(T* out, const int32_t* tokens, const W* wte, const T* wpe, int64_t B, int64_t Tlen, int64_t C);

// dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += sum_b dout[b,t,:] (dwpe may be null).
template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B, int64_t Tlen, int64_t C);

}  // namespace megaton::kernels::cpu
