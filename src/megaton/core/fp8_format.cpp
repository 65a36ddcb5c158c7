#include "megaton/core/fp8_format.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "megaton/core/error.h"

namespace megaton::fp8 {

namespace {

constexpr FormatInfo kE4M3{"e4m3", 4, 3, 7, 448.0f, 0x7e};
constexpr FormatInfo kE5M2{"e5m2", 5, 2, 15, 57344.0f, 0x7b};
std::array<float, 256> decode_table(const FormatInfo& fi) {
  std::array<float, 256> t{};
  const int m = fi.mantissa_bits;
  const uint32_t exp_all_ones = (1u << fi.exponent_bits) - 1u;
  for (uint32_t code = 0; code < 256; ++code) {
    const uint32_t mag = code & 0x7fu;
    const uint32_t exp = mag >> m, mant = mag & ((1u << m) - 1u);
    float v;
    if (fi.exponent_bits == 4 && mag == 0x7fu) {
      v = std::numeric_limits<float>::quiet_NaN();
    } else if (fi.exponent_bits == 5 && exp == exp_all_ones) {
      v = mant == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
    } else if (exp == 0) {
      v = std::ldexp(static_cast<float>(mant), 1 - fi.bias - m);
    } else {
      v = std::ldexp(static_cast<float>(mant + (1u << m)), static_cast<int>(exp) - fi.bias - m);
    }
    t[code] = (code & 0x80u) ? -v : v;
  }
  return t;
}

const std::array<float, 256>& table(Format f) {
  static const std::array<float, 256> e4m3 = decode_table(kE4M3), e5m2 = decode_table(kE5M2);
  return f == Format::E4M3 ? e4m3 : e5m2;
}

}  // namespace

const FormatInfo& info(Format f) { return f == Format::E4M3 ? kE4M3 : kE5M2; }

Format format_from_name(std::string_view name) {
  if (name == kE4M3.name) return Format::E4M3;
  if (name == kE5M2.name) return Format::E5M2;
  fail("unknown FP8 format '", name, "' (expected e4m3 or e5m2)");
}

DType dtype_of_format(Format f) { return f == Format::E4M3 ? DType::F8E4M3 : DType::F8E5M2; }

Format format_of_dtype(DType t) {
  if (t == DType::F8E4M3) return Format::E4M3;
  if (t == DType::F8E5M2) return Format::E5M2;
  fail("dtype ", dtype_name(t), " is not an FP8 format (expected f8e4m3 or f8e5m2)");
}

uint8_t encode(float x, Format f, Overflow overflow) {
  const bool sat = overflow == Overflow::Saturate;
  if (f == Format::E4M3) return sat ? encode_inline<Format::E4M3, true>(x) : encode_inline<Format::E4M3, false>(x);
  return sat ? encode_inline<Format::E5M2, true>(x) : encode_inline<Format::E5M2, false>(x);
}

float decode(uint8_t code, Format f) { return table(f)[code]; }

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

}  // namespace megaton::fp8
