// Overflow-safe size arithmetic. Sizes computed from numbers that come from outside (config keys,
// file headers, CLI flags) go through these, so a huge value is an error naming what was being
// sized instead of a wrapped size and a write past a small allocation.
#pragma once
#include <cstdint>
#include <string_view>

#include "megaton/core/error.h"

namespace megaton {

// a * b and a + b, or an error "<what>: size a * b overflows int64".
inline int64_t checked_mul(std::string_view what, int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail(what, ": size ", a, " * ", b, " overflows int64");
  return r;
}

inline int64_t checked_add(std::string_view what, int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail(what, ": size ", a, " + ", b, " overflows int64");
  return r;
}

}  // namespace megaton
