// Storage versus compute types of the CPU kernels. A kernel template over the stored element type T
// loads each element into compute_t<T>, does its math there and stores the result back as T: f32
// and f64 compute in themselves, bf16 in fp32 (TransformerEngine's convention: bf16 tensors, fp32
// math and fp32 statistics); fp16 likewise. Converting element by element inside the kernels' loops keeps bf16
// tensors from being copied whole into f32 temporaries.
#pragma once
#include <type_traits>

#include "megaton/core/dtype.h"

namespace megaton::kernels::cpu {

template <typename T>
struct ComputeType {
  using type = T;
};
template <>
struct ComputeType<BFloat16> {
  using type = float;
};
template <>
struct ComputeType<Float16> {
  using type = float;
};
template <typename T>
using compute_t = typename ComputeType<T>::type;

inline float load(BFloat16 v) { return bf16_to_float(v.bits); }
inline float load(Float16 v) { return f16_to_float(v.bits); }
inline float load(float v) { return v; }
inline double load(double v) { return v; }

// v rounded to the storage type T (round to nearest even for bf16 and fp16; beyond fp16's range
// inf, as IEEE rounding gives).
template <typename T, typename C>
T store(C v) {
  if constexpr (std::is_same_v<T, BFloat16>)
    return BFloat16{float_to_bf16(static_cast<float>(v))};
  else if constexpr (std::is_same_v<T, Float16>)
    return Float16{float_to_f16(static_cast<float>(v))};
  else
    return static_cast<T>(v);
}

}  // namespace megaton::kernels::cpu
