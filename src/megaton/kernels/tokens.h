// Token-id tensors moved along the sequence: multi-token prediction's inputs and targets at depth
// k are the ids k positions ahead (Megatron's roll_tensor, shifted left with the end filled).
#pragma once
#include <cstdint>

#include "megaton/kernels/exec_context.h"

namespace megaton::kernels {

// out[b, t] = ids[b, t + shift] for t + shift < T, else `fill`; ids and out [B, T] i32, shift >= 0.
void shift_tokens(const ExecContext& ctx, const Tensor& out, const Tensor& ids, int64_t shift, int32_t fill);

}  // namespace megaton::kernels
