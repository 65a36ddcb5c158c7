// CUDA token + position embedding: out / dout in f32 or bf16, the tables (wte, wpe) f32 or bf16 in
// the forward, their gradients f32 (the main grads). Shapes were checked by kernels/embedding.cpp.
// The backward is deterministic (no atomics): each dwte element is owned by one thread, which adds
// the rows of its token in increasing row order, as the CPU reference does.
#pragma once
#include "megaton/kernels/exec_context.h"

namespace megaton::kernels::cuda {

void embedding_forward(const ExecContext& ctx, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                       const Tensor& wpe, int64_t B, int64_t T, int64_t C);
void embedding_backward(const ExecContext& ctx, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                        const Tensor& tokens, int64_t B, int64_t T, int64_t C);

}  // namespace megaton::kernels::cuda
