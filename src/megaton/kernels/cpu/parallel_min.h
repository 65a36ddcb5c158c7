#pragma once

#include <cstdint>

namespace megaton::kernels::cpu {

// Elements (weights read, or values written) below which a kernel runs on the calling thread
// instead of opening an OpenMP region. Starting and joining a team costs each side a futex system
// call (libgomp wakes sleepers unconditionally), several microseconds in a VM, while one core does
// 32 K fused element operations in about that time. Batch-1 decode calls the norms, RoPE, SwiGLU and
// residual adds on one token's row: as regions they were 61 of 149 per token of the 110M shape
// (performance.md, "Tiny kernels on the calling thread").
constexpr int64_t kParallelMin = 1 << 15;

}  // namespace megaton::kernels::cpu
