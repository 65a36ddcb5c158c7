// TransformerEngine's compute_scale_from_amax, shared by the CPU quantiser and the CUDA kernels
// (one definition, so both compute the same scale bit for bit): current scaling and every tile of
// the block recipes. An amax below epsilon counts as epsilon; an amax of 0, inf or NaN gives scale
// 1; a scale that overflows fp32 becomes FLT_MAX; pow2 rounds it down to a power of two (exact
// scaling).
#pragma once
#include <cfloat>

#include "megaton/core/host_device.h"

namespace megaton::kernels {

MEGATON_HOST_DEVICE inline float fp8_scale_from_amax(float amax, float fp8_max, bool pow2 = false,
                                                     float epsilon = 0.0f) {
  if (amax < epsilon) amax = epsilon;
  if (amax != amax || amax == 0.0f || amax > FLT_MAX || amax < -FLT_MAX) return 1.0f;
  float scale = fp8_max / amax;
  if (scale > FLT_MAX) scale = FLT_MAX;
  if (pow2) scale = float_from_bits(float_bits(scale) & 0xff800000u);  // keep sign and exponent
  return scale;
}

}  // namespace megaton::kernels
