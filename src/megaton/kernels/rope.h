// Rotary position embedding (RoPE) on tensors, applied in place to the q and k heads of a fused QKV
// tensor, and the plain helpers that set it up (layouts, inverse frequencies with Llama-3 scaling).
// Dispatches to kernels::cpu (f32 / f64, and bf16 x with f32 tables, rotated in fp32 and rounded
// once: bf16 training's qkv where it attends in bf16, kernels::attention_dtype; elsewhere it rotates
// an f32 copy, see nn/attention.cpp) or kernels::cuda (f32; the tables made on the host in double
// and copied).
#pragma once
#include <cstdint>
#include <vector>

#include "megaton/kernels/exec_context.h"
#include "megaton/kernels/head_strides.h"

namespace megaton::kernels {

enum class RopeLayout {
  Half,        // HF Llama "rotate_half": dimension i pairs with i + D/2
  Interleaved  // original RoFormer / Meta: dimension 2i pairs with 2i + 1
};

// Frequency scaling for contexts longer than the model was trained on. factor <= 0 disables it.
// Llama-3's ("rope_type": "llama3" in HF config.json) by default; YaRN's (DeepSeek-V2 / V3:
// "type": "yarn") when `yarn` is set, with Megatron's / HF's beta_fast, beta_slow, mscale and
// mscale_all_dim.
struct RopeScaling {
  double factor = 0.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position = 8192.0;
  bool yarn = false;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

// inv_freq[i] = theta^(-2i/D), i < D/2, with the optional Llama-3 or YaRN scaling applied. YaRN keeps
// the dimensions that turn more than beta_fast times over the original context, divides the
// frequency of those turning fewer than beta_slow times by `factor`, and ramps linearly between.
std::vector<double> rope_inv_freq(int64_t D, double theta, const RopeScaling& scaling);

// YaRN's attention temperature: 0.1 * m * ln(factor) + 1 for factor > 1, else 1.
double yarn_mscale(double factor, double m);
// What YaRN multiplies into the rotation (the cos / sin tables): yarn_mscale(factor, mscale) /
// yarn_mscale(factor, mscale_all_dim); 1 without YaRN.
double rope_magnitude(const RopeScaling& scaling);
// What YaRN multiplies into the softmax scale: yarn_mscale(factor, mscale_all_dim)^2 when
// mscale_all_dim is set; 1 otherwise (DeepSeek-V3's softmax_scale).
double rope_softmax_factor(const RopeScaling& scaling);

// Fills the cos / sin tables [P, D/2] (D = 2 * inv_freq.size()) for positions 0..P-1:
// magnitude * cos(angle) and magnitude * sin(angle) with angle = pos * inv_freq[i], evaluated in double.
void rope_tables(const ExecContext& ctx, const Tensor& cos, const Tensor& sin, const std::vector<double>& inv_freq,
                 double magnitude = 1.0);

// Rotates x in place: in every token of a [B, Tlen] batch, heads 0..H-1 of each of the `groups`
// groups, placed as `at` says (head_strides.h) from element 0 of x. For Megatron's fused QKV
// tensor [B*Tlen, qkv_size]: at = {qkv_size, (Hq/Hkv + 2) * D}, groups = Hkv and H = Hq/Hkv + 1
// rotate every q and k head and leave v alone. Token t uses position pos_offset + t, i.e. row
// pos_offset + t of the tables cos / sin [P, D/2] (P >= pos_offset + Tlen). inverse = true rotates
// by the negative angle: the backward pass (the transpose, also when the tables carry a magnitude).
void rope_apply(const ExecContext& ctx, const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t B, int64_t Tlen,
                int64_t groups, int64_t H, int64_t D, HeadStrides at, int64_t pos_offset, RopeLayout layout,
                bool inverse);

}  // namespace megaton::kernels
