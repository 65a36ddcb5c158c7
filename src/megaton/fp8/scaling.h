// Scale factors of the FP8 recipes. A quantised value is q = encode(x * scale) and x ~ decode(q) *
// scale_inv with scale_inv = 1 / scale, as TransformerEngine stores them.
//   - per-tensor "current" scaling (TE's Float8CurrentScaling, DeepSeek-V3's tiles and blocks):
//     scale = fp8_max / amax, optionally rounded down to a power of two;
//   - delayed scaling (TE's DelayedScaling): the same formula on an amax taken from a history of
//     earlier steps, with a margin (delayed_scaling.h);
//   - MXFP8 (OCP microscaling, TE's MXFP8BlockScaling): a power-of-two scale_inv per 32 elements,
//     stored as E8M0 (a biased exponent), rounded up so that the block never saturates.
#pragma once
#include <cstdint>

namespace megaton::fp8 {

// TransformerEngine's compute_scale_from_amax: amax below epsilon counts as epsilon; an amax that is
// 0, inf or NaN gives scale 1; a scale that overflows fp32 becomes FLT_MAX; pow2 rounds the scale
// down to a power of two (so scaling is exact and scale_inv too).
float scale_from_amax(float amax, float fp8_max, bool pow2 = false, float epsilon = 0.0f);

// E8M0: value 2^(code - 127); 0xff is NaN. TE's float_to_e8m0: the exponent of `v` rounded up (a
// value with a mantissa moves to the next power of two), inf -> 0xfe, NaN -> 0xff, 0 -> 0x00.
uint8_t e8m0_from_float(float v);
float e8m0_to_float(uint8_t code);   // 2^(code - 127) (0 gives 2^-127); NaN for 0xff
// The MX element scale for a block with this amax: the E8M0 of amax / fp8_max, so that every
// |x| / 2^(code - 127) <= fp8_max.
uint8_t mx_scale_code(float amax, float fp8_max);

}  // namespace megaton::fp8
