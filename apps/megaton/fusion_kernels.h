// `megaton bench --fusion-kernels`: each fused kernel of nn/fusion.h against the unfused
// composition it replaces, at one layer's shapes of a preset (batch x seq-len rows), timed in
// isolation: what each fusion saves per layer and pass, next to the bytes its elementwise passes
// move (the GEMM's own operand traffic, the same in both, not counted).
#pragma once
#include <cstdint>

#include "megaton/core/dtype.h"
#include "megaton/models/transformer_config.h"

namespace megaton::app {

// One line per fusion and pass (or one JSON object per line) with the median seconds of the
// unfused and fused forms over `repeats` samples, in `dtype` (f32 or bf16) on the cpu.
void print_fusion_kernels(const models::TransformerConfig& cfg, int64_t tokens, int repeats, bool json, DType dtype);

}  // namespace megaton::app
