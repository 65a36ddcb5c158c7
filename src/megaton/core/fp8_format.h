// FP8 element formats (OCP FP8, as NVIDIA Hopper implements them): E4M3 (max 448, NaN, no inf) and
// E5M2 (max 57344, inf and NaN), with conversions bit-exact with the host conversions of CUDA's
// cuda_fp8.h: round to nearest even, NaN to the canonical 0x7f, and overflow either saturating to
// the largest finite value (__NV_SATFINITE, what training uses) or going non-finite (__NV_NOSAT:
// NaN for E4M3, inf for E5M2). Every FP8 value is exact in bf16, fp16 and fp32.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "megaton/core/dtype.h"
#include "megaton/core/host_device.h"

namespace megaton::fp8 {

enum class Format : uint8_t { E4M3, E5M2 };

struct FormatInfo {
  std::string_view name;  // "e4m3", "e5m2"
  int exponent_bits;
  int mantissa_bits;
  int bias;
  float max;              // largest finite magnitude: 448, 57344
  uint8_t max_code;       // its encoding: 0x7e, 0x7b
};
const FormatInfo& info(Format f);
Format format_from_name(std::string_view name);  // throws naming an unknown format
DType dtype_of_format(Format f);                  // F8E4M3, F8E5M2
Format format_of_dtype(DType t);                  // throws unless t is an FP8 dtype

enum class Overflow : uint8_t { Saturate, NonFinite };

// Encodes x (any float, including subnormals, inf and NaN).
uint8_t encode(float x, Format f, Overflow overflow = Overflow::Saturate);

namespace detail {
// Round to nearest even of v >> s (s >= 1): add half - 1 and the kept part's lowest bit, then shift.
MEGATON_HOST_DEVICE inline uint32_t round_shift(uint32_t v, uint32_t s) {
  return (v + (1u << (s - 1)) - 1u + ((v >> s) & 1u)) >> s;
}
}  // namespace detail

// encode(x, F, Saturate or NonFinite) in straight-line integer code that the compiler vectorises
// (the quantiser's loops call it): the target-normal and target-subnormal roundings are both
// computed and one is selected. encode() itself runs this, so the CUDA-reference test covers it;
// the CUDA quantiser's kernels run it too.
template <Format F, bool kSaturate = true>
MEGATON_HOST_DEVICE inline uint8_t encode_inline(float x) {
  constexpr int32_t m = F == Format::E4M3 ? 3 : 2, bias = F == Format::E4M3 ? 7 : 15;
  constexpr uint32_t max_code = F == Format::E4M3 ? 0x7eu : 0x7bu;
  constexpr uint32_t overflow_code = kSaturate ? max_code : (F == Format::E4M3 ? 0x7fu : 0x7cu);
  const uint32_t u = float_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  const int32_t e = static_cast<int32_t>(a >> 23) - 127;
  // Normal in the target: exponent rebiased, top m mantissa bits rounded (a carry out of the
  // mantissa moves into the exponent: the correctly rounded next binade; inf lands above max_code).
  const uint32_t normal =
      detail::round_shift((static_cast<uint32_t>(e + bias) << 23) | (a & 0x7fffffu), static_cast<uint32_t>(23 - m));
  // Subnormal in the target: the significand in units of the smallest subnormal, 2^(1 - bias - m);
  // a shift of 25 or more leaves 0 (float subnormals included), so it is capped at 31.
  const int32_t shift = 24 - bias - m - e;
  const uint32_t sub = detail::round_shift((a & 0x7fffffu) | 0x800000u,
                                           static_cast<uint32_t>(shift < 1 ? 1 : (shift > 31 ? 31 : shift)));
  uint32_t mag = e >= 1 - bias ? normal : sub;
  mag = mag > max_code ? overflow_code : mag;
  return a > 0x7f800000u ? uint8_t{0x7f} : static_cast<uint8_t>(sign | mag);
}
// The value of a code (NaN codes decode to a quiet NaN; E5M2's inf codes to +-inf).
float decode(uint8_t code, Format f);

// E8M0 (the OCP MX scale format): value 2^(code - 127), 0xff is NaN. from_float is TE's
// float_to_e8m0: the exponent of `v` rounded up (a value with a mantissa moves to the next power of
// two), inf -> 0xfe, NaN -> 0xff, 0 -> 0x00.
uint8_t e8m0_from_float(float v);
float e8m0_to_float(uint8_t code);  // 2^(code - 127) (0 gives 2^-127); NaN for 0xff

}  // namespace megaton::fp8
