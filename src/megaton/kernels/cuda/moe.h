// CUDA MoE token permutation (kernels/moe.h's moe_permute / moe_unpermute and their backward): rows
// of C elements moved by the dispatch plan's pos [N, K] (i32, -1 for a dropped slot), f32 or bf16
// rows with fp32 sums over the K slots in slot order (deterministic, no atomics); probs in the rows'
// dtype, as on the CPU. The dispatcher has checked shapes and that pos names rows in range.
#pragma once
#include "megaton/kernels/exec_context.h"

namespace megaton::kernels::cuda {

void moe_permute(const ExecContext& ctx, const Tensor& out, const Tensor& x, const Tensor& pos, int64_t N, int64_t K,
                 int64_t C);
void moe_permute_backward(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& pos, int64_t N,
                          int64_t K, int64_t C);
void moe_unpermute(const ExecContext& ctx, const Tensor& y, const Tensor& rows, const Tensor& pos, const Tensor& probs,
                   int64_t N, int64_t K, int64_t C);
void moe_unpermute_backward(const ExecContext& ctx, const Tensor& drows, const Tensor& dprobs, const Tensor& dy,
                            const Tensor& rows, const Tensor& pos, const Tensor& probs, int64_t N, int64_t K,
                            int64_t C);

}  // namespace megaton::kernels::cuda
