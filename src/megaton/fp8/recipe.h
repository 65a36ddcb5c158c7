// FP8 training recipes (Megatron's `--fp8-format`, `--fp8-recipe`, `--fp8-margin`,
// `--fp8-amax-history-len`, `--fp8-amax-compute-algo`):
//   delayed     TE's DelayedScaling: per-tensor scales from an amax history (delayed_scaling.h);
//   tensorwise  TE's Float8CurrentScaling: per-tensor scales from the tensor's own amax;
//   blockwise   DeepSeek-V3 / TE's Float8BlockScaling: 1x128 tiles for activations and gradients,
//               128x128 blocks for weights, fp32 scales;
//   mxfp8       OCP MXFP8 / TE's MXFP8BlockScaling: 1x32 blocks with E8M0 power-of-two scales.
// Format "e4m3" uses E4M3 for every tensor; "hybrid" E4M3 forward and E5M2 for gradients.
#pragma once
#include <string_view>

#include "megaton/fp8/delayed_scaling.h"
#include "megaton/kernels/fp8_quantize.h"

namespace megaton::fp8 {

enum class Recipe : uint8_t { Delayed, Tensorwise, Blockwise, Mxfp8 };
Recipe recipe_from_name(std::string_view name);  // throws listing the recipes
std::string_view recipe_name(Recipe r);

struct Fp8Config {
  bool hybrid = false;  // E5M2 gradients
  Recipe recipe = Recipe::Delayed;
  DelayedScalingConfig delayed;
  bool pow2_scales = false;  // tensorwise and blockwise scales rounded down to powers of two

  Format forward_format() const { return Format::E4M3; }
  Format gradient_format() const { return hybrid ? Format::E5M2 : Format::E4M3; }
  // The granularity of activations / gradients and of weights under this recipe.
  kernels::Fp8Granularity activation_granularity() const;
  kernels::Fp8Granularity weight_granularity() const;
};
// "e4m3" | "hybrid" (Megatron's fp8 format values); throws otherwise.
bool hybrid_from_format_name(std::string_view name);

}  // namespace megaton::fp8
