// Rotary position embedding (RoPE), applied in place to the q and k heads of a fused QKV buffer.
#pragma once
#include <cstdint>
#include <vector>

#include "megaton/kernels/head_strides.h"

namespace megaton::kernels {

enum class RopeLayout {
  Half,        // HF Llama "rotate_half": dimension i pairs with i + D/2
  Interleaved  // original RoFormer / Meta: dimension 2i pairs with 2i + 1
};

// Llama-3 frequency scaling ("rope_type": "llama3" in HF config.json). factor <= 0 disables it.
struct RopeScaling {
  double factor = 0.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position = 8192.0;
};

// inv_freq[i] = theta^(-2i/D), i < D/2, with the optional Llama-3 scaling applied.
std::vector<double> rope_inv_freq(int64_t D, double theta, const RopeScaling& scaling);

// cos/sin tables [Tlen, D/2] for positions 0..Tlen-1: angle = pos * inv_freq[i].
template <typename T>
void rope_tables(T* cos, T* sin, int64_t Tlen, int64_t D, const std::vector<double>& inv_freq);

// Rotate x in place: in every token, heads 0..H-1 of each of the `groups` groups, placed as `at`
// says (head_strides.h). In Megatron's fused QKV row a group's q heads are followed by its k head,
// so H = Hq / Hkv + 1 rotates q and k in one call and leaves v alone. Token t uses position
// pos_offset + t, i.e. row (pos_offset + t) of the tables. inverse=true rotates by the negative
// angle, which is exactly the backward pass (the rotation is orthogonal).
template <typename T>
void rope_apply(T* x, const T* cos, const T* sin, int64_t B, int64_t Tlen, int64_t groups, int64_t H, int64_t D,
                HeadStrides at, int64_t pos_offset, RopeLayout layout, bool inverse);

}  // namespace megaton::kernels
