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
// The value of a code (NaN codes decode to a quiet NaN; E5M2's inf codes to +-inf).
float decode(uint8_t code, Format f);

// E8M0 (the OCP MX scale format): value 2^(code - 127), 0xff is NaN. from_float is TE's
// float_to_e8m0: the exponent of `v` rounded up (a value with a mantissa moves to the next power of
// two), inf -> 0xfe, NaN -> 0xff, 0 -> 0x00.
uint8_t e8m0_from_float(float v);
float e8m0_to_float(uint8_t code);  // 2^(code - 127) (0 gives 2^-127); NaN for 0xff

}  // namespace megaton::fp8
