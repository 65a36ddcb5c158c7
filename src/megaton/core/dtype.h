// Element types a Tensor can hold, with their sizes and bf16/fp16 conversions.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

namespace megaton {

// F8E4M3 / F8E5M2: FP8 codes (core/fp8_format.h); their scales are held beside the tensor.
enum class DType : uint8_t { F32, F64, BF16, F16, I32, I64, U8, I8, U16, I16, U32, U64, F8E4M3, F8E5M2 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);          // "f32", "bf16", ...
DType dtype_from_name(std::string_view name);  // throws Error naming the unknown dtype

// A bf16 element as stored (the upper 16 bits of an IEEE float). A distinct type, not uint16_t, so
// that Tensor::data<BFloat16>() and kernel templates tell bf16 storage from u16.
struct BFloat16 {
  uint16_t bits;
};
// An IEEE half (fp16) element as stored; distinct for the same reason.
struct Float16 {
  uint16_t bits;
};

// FP8 elements as stored: distinct types so that data<T>() tells the two formats and u8 apart.
struct Float8E4M3 {
  uint8_t bits;
};
struct Float8E5M2 {
  uint8_t bits;
};

template <typename T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<BFloat16>() { return DType::BF16; }
template <> constexpr DType dtype_of<Float16>() { return DType::F16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }
template <> constexpr DType dtype_of<int8_t>() { return DType::I8; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::U16; }
template <> constexpr DType dtype_of<int16_t>() { return DType::I16; }
template <> constexpr DType dtype_of<uint32_t>() { return DType::U32; }
template <> constexpr DType dtype_of<uint64_t>() { return DType::U64; }
template <> constexpr DType dtype_of<Float8E4M3>() { return DType::F8E4M3; }
template <> constexpr DType dtype_of<Float8E5M2>() { return DType::F8E5M2; }

// The 16-bit float storage types (bf16, fp16): the CPU kernels compute them in fp32 and keep their
// weight gradients in fp32.
template <typename T>
inline constexpr bool is_half_v = std::is_same_v<T, BFloat16> || std::is_same_v<T, Float16>;

// bfloat16: upper 16 bits of an IEEE float, rounded to nearest even (NaN stays NaN).
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE half precision, round to nearest even, with subnormals and inf/NaN.
uint16_t float_to_f16(float f);
float f16_to_float(uint16_t h);

}  // namespace megaton
