#include "megaton/core/dtype.h"

#include <array>
#include <cmath>

#include "megaton/core/error.h"

namespace megaton {

namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};
constexpr std::array<DTypeInfo, 14> kInfo{{{DType::F32, "f32", 4},
                                           {DType::F64, "f64", 8},
                                           {DType::BF16, "bf16", 2},
                                           {DType::F16, "f16", 2},
                                           {DType::I32, "i32", 4},
                                           {DType::I64, "i64", 8},
                                           {DType::U8, "u8", 1},
                                           {DType::I8, "i8", 1},
                                           {DType::U16, "u16", 2},
                                           {DType::I16, "i16", 2},
                                           {DType::U32, "u32", 4},
                                           {DType::U64, "u64", 8},
                                           {DType::F8E4M3, "f8e4m3", 1},
                                           {DType::F8E5M2, "f8e5m2", 1}}};
}  // namespace

size_t dtype_size(DType t) { return kInfo[static_cast<size_t>(t)].size; }
std::string_view dtype_name(DType t) { return kInfo[static_cast<size_t>(t)].name; }

DType dtype_from_name(std::string_view name) {
  for (const auto& i : kInfo)
    if (i.name == name) return i.type;
  fail("unknown dtype '", name, "' (expected one of f32, f64, bf16, f16, i32, i64, u8, i8, u16, i16, u32, u64, f8e4m3, f8e5m2)");
}

uint16_t float_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (mag >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (mag < 0x38800000u) {                                                // subnormal or zero
    float a = std::fabs(f);
    // Scale so that the subnormal unit (2^-24) becomes 1, then round to nearest even.
    float scaled = a * 16777216.0f;
    uint32_t r = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t exp = ((mag >> 23) - 112u) << 10;
  uint32_t mant = mag & 0x7fffffu;
  uint32_t h = exp | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float f16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    float v = std::ldexp(static_cast<float>(mant), -24);
    return (h & 0x8000u) ? -v : v;
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

}  // namespace megaton
