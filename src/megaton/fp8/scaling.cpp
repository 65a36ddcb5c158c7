#include "megaton/fp8/scaling.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace megaton::fp8 {

float scale_from_amax(float amax, float fp8_max, bool pow2, float epsilon) {
  if (amax < epsilon) amax = epsilon;
  if (std::isinf(amax) || amax == 0.0f || std::isnan(amax)) return 1.0f;
  float scale = fp8_max / amax;
  if (std::isinf(scale)) scale = std::numeric_limits<float>::max();
  if (pow2) {
    uint32_t bits;
    std::memcpy(&bits, &scale, sizeof bits);
    bits &= 0xff800000u;  // keep sign and exponent: round down to a power of two
    std::memcpy(&scale, &bits, sizeof bits);
  }
  return scale;
}

uint8_t e8m0_from_float(float v) {
  if (std::isnan(v)) return 0xff;
  if (std::isinf(v)) return 0xfe;
  if (v == 0.0f) return 0x00;
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  uint32_t exponent = (bits >> 23) & 0xffu;
  const uint32_t mantissa = bits & 0x7fffffu;
  // Round up to the next power of two, saturating at 0xfe; a float subnormal at most half the
  // smallest normal (mantissa <= 2^22) maps to 2^-127 = code 0.
  if (mantissa > 0 && exponent != 0xfe && !(exponent == 0 && mantissa <= 0x400000u)) ++exponent;
  return static_cast<uint8_t>(exponent);
}

float e8m0_to_float(uint8_t code) {
  if (code == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(code) - 127);
}

uint8_t mx_scale_code(float amax, float fp8_max) { return e8m0_from_float(amax * (1.0f / fp8_max)); }

}  // namespace megaton::fp8
