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
constexpr uint8_t kCanonicalNaN = 0x7f;

// Round-to-nearest-even of `bits` shifted right by `shift` (1..31).
inline uint32_t shift_round_even(uint32_t bits, uint32_t shift) {
  const uint32_t kept = bits >> shift;
  const uint32_t rest = bits & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

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
  const FormatInfo& fi = info(f);
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return kCanonicalNaN;
  const uint32_t m = static_cast<uint32_t>(fi.mantissa_bits);
  const int e = static_cast<int>(a >> 23) - 127;  // float subnormals (e = -127) are far below FP8's range
  uint32_t mag;
  if (a == 0x7f800000u) {
    mag = 0x100u;  // beyond every format: the overflow rule below decides
  } else if (e >= 1 - fi.bias) {
    // Normal in the target: exponent and the top m mantissa bits, rounded; a carry out of the mantissa
    // moves into the exponent field, which is the correctly rounded next binade.
    mag = shift_round_even((static_cast<uint32_t>(e + fi.bias) << 23) | (a & 0x7fffffu), 23u - m);
  } else {
    // Subnormal in the target: the significand (implicit bit included) in units of the smallest
    // subnormal, 2^(1 - bias - m); rounding up to 2^m lands on the smallest normal's code.
    const int shift = 24 - fi.bias - static_cast<int>(m) - e;
    mag = shift >= 32 ? 0u : shift_round_even((a & 0x7fffffu) | 0x800000u, static_cast<uint32_t>(shift));
  }
  if (mag > fi.max_code) {
    if (overflow == Overflow::Saturate) mag = fi.max_code;
    else mag = f == Format::E4M3 ? 0x7fu : 0x7cu;  // NaN / inf, signed as CUDA does
  }
  return static_cast<uint8_t>(sign | mag);
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
