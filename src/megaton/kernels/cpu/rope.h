// Rotary position embedding (RoPE) on pointers, applied in place to the q and k heads of a fused
// QKV buffer. float (training, inference), double (the finite-difference gradient checks) and bf16
// (bf16 training's attention input: rotated in fp32 with f32 tables, rounded once).
#pragma once
#include <cstdint>
#include <vector>

#include "megaton/kernels/cpu/element.h"
#include "megaton/kernels/head_strides.h"
#include "megaton/kernels/rope.h"  // RopeLayout

namespace megaton::kernels::cpu {

// cos/sin tables [Tlen, D/2] for positions 0..Tlen-1: angle = pos * inv_freq[i].
template <typename T>
void rope_tables(T* cos, T* sin, int64_t Tlen, int64_t D, const std::vector<double>& inv_freq, double magnitude = 1.0);

// Rotate x in place: in every token, heads 0..H-1 of each of the `groups` groups, placed as `at`
// says (head_strides.h). In Megatron's fused QKV row a group's q heads are followed by its k head,
// so H = Hq / Hkv + 1 rotates q and k in one call and leaves v alone. Token t uses position
// pos_offset + t, i.e. row (pos_offset + t) of the tables. inverse=true rotates by the negative
// angle, which is exactly the backward pass (the rotation is orthogonal).
template <typename T>
void rope_apply(T* x, const compute_t<T>* cos, const compute_t<T>* sin, int64_t B, int64_t Tlen, int64_t groups,
                int64_t H, int64_t D, HeadStrides at, int64_t pos_offset, RopeLayout layout, bool inverse);

}  // namespace megaton::kernels::cpu
