// Token + learned position embedding on tensors. tokens: i32 [B, T], each < wte's rows (the
// caller checks, see kernels/reduce.h); wte [vocab, C]; wpe [T, C] (the position rows this call
// uses, already offset) or undefined; out / dout [B*T, C]. Dispatches to kernels::cpu (f32 / f64,
// every tensor one dtype, or a bf16 wte beside f32 rows and positions in the forward) or kernels::cuda (out / dout f32
// or bf16, tables f32 or bf16, gradients f32).
#pragma once
#include "megaton/kernels/exec_context.h"

namespace megaton::kernels {

// out[b*T + t] = wte[tokens[b, t]] + wpe[t].
void embedding_forward(const ExecContext& ctx, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                       const Tensor& wpe);
// dwte[tokens[b, t]] += dout[b*T + t]; dwpe[t] += sum_b dout[b*T + t] (dwpe may be undefined).
void embedding_backward(const ExecContext& ctx, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                        const Tensor& tokens);

}  // namespace megaton::kernels
