// Exact conversion between token ids and the element types an indexed dataset may store them in.
// Megatron allows float dtypes too, so every conversion checks that the value survives unchanged.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "megaton/core/dtype.h"
#include "megaton/core/error.h"

namespace megaton::data {

// True when v converts to To without changing value: integers in range, floats finite and integral.
template <typename To, typename From>
bool token_fits(From v) {
  if constexpr (std::is_floating_point_v<From>) {
    static_assert(std::is_integral_v<To> && std::is_signed_v<To>);
    // The integers of To are [lo, -lo); both bounds are powers of two, so exact in any float type.
    constexpr double lo = static_cast<double>(std::numeric_limits<To>::min());
    return std::isfinite(v) && v == std::trunc(v) && v >= lo && v < -lo;
  } else if constexpr (std::is_floating_point_v<To>) {
    To t = static_cast<To>(v);
    return token_fits<int64_t>(t) && static_cast<int64_t>(t) == v;
  } else {
    return std::in_range<To>(v);
  }
}

// Converts n tokens; returns the index of the first one that does not fit (n when all fit).
template <typename To, typename From>
size_t convert_tokens(const From* src, size_t n, To* dst) {
  for (size_t i = 0; i < n; ++i) {
    if (!token_fits<To>(src[i])) return i;
    dst[i] = static_cast<To>(src[i]);
  }
  return n;
}

// Calls f(std::type_identity<T>{}) with T the C++ type of a Megatron token dtype.
template <typename F>
decltype(auto) visit_token_type(DType t, F&& f) {
  switch (t) {
    case DType::U8:
      return f(std::type_identity<uint8_t>{});
    case DType::I8:
      return f(std::type_identity<int8_t>{});
    case DType::I16:
      return f(std::type_identity<int16_t>{});
    case DType::I32:
      return f(std::type_identity<int32_t>{});
    case DType::I64:
      return f(std::type_identity<int64_t>{});
    case DType::F64:
      return f(std::type_identity<double>{});
    case DType::F32:
      return f(std::type_identity<float>{});
    case DType::U16:
      return f(std::type_identity<uint16_t>{});
    default:
      fail("dtype ", dtype_name(t), " cannot hold indexed dataset tokens");
  }
}

}  // namespace megaton::data
