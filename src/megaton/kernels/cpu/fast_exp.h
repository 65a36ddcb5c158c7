// exp() that GCC auto-vectorises. Without -ffast-math glibc's expf has no SIMD variant, so a loop
// calling std::exp runs one element at a time; the softmax in attention and cross-entropy spends
// most of its time there. This is the Cephes expf (range reduction to [-ln2/2, ln2/2] and a
// degree-7 polynomial, about 1 ulp), written with selects and bit casts only so every step maps to
// a vector instruction. double keeps std::exp: it is only used by the finite-difference tests,
// which need full precision more than speed.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace megaton::kernels::detail {

// Inputs below kExpMin return exactly 0 (exp(-87) ~ 1.6e-38 is already at the bottom of the normal
// range), which also covers -inf from masked scores. Inputs are clamped at 88 so the exponent
// cannot overflow; the kernels only pass x <= 0.
inline float fast_exp(float x) {
  constexpr float kExpMin = -87.0f, kExpMax = 88.0f;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // ln2 = hi + lo, hi exact in 9 bits
  constexpr float kRoundShift = 12582912.0f;                        // 1.5 * 2^23: adding it rounds to an integer
  const float xc = x < kExpMin ? kExpMin : (x > kExpMax ? kExpMax : x);
  const float n = (xc * kLog2e + kRoundShift) - kRoundShift;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float two_n = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return x < kExpMin ? 0.0f : p * two_n;
}

inline double fast_exp(double x) { return std::exp(x); }

}  // namespace megaton::kernels::detail
