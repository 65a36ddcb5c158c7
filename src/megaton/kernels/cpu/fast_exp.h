// exp() that GCC auto-vectorises, shared by every CPU kernel with an exponential (GeLU, SwiGLU,
// softmax in attention and cross-entropy). Without -ffast-math glibc's exp has no SIMD variant, so a
// loop calling std::exp runs one element at a time.
#pragma once
#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <numbers>
#include <type_traits>

namespace megaton::kernels::detail {

// ln 2 split so that n * hi is exact for the |n| <= 1022 used below (Cody & Waite); lo holds the rest.
template <typename T>
struct Ln2Split;
template <>
struct Ln2Split<float> {
  static constexpr float hi = 0.693359375f, lo = -2.12194440e-4f;
};
template <>
struct Ln2Split<double> {
  static constexpr double hi = 6.93147180369123816490e-01, lo = 1.90821492927058770002e-10;
};

// exp(x) written so that loops calling it vectorise: glibc's exp has vector variants only under
// -ffast-math, and a scalar exp call makes GeLU/SwiGLU ~6x slower than memory speed. x = n ln2 + r
// with |r| <= ln2 / 2; exp(r) is its Taylor series (degree 7 for float, 13 for double, truncation
// below half an ulp) and 2^n is assembled in the exponent bits. x is clamped so that 2^n stays a
// normal number: results saturate near the smallest normal / largest finite value instead of
// reaching 0 / inf, which no caller here can tell apart.
template <typename T>
inline T exp_saturating(T x) {
  using Bits = std::conditional_t<std::is_same_v<T, float>, int32_t, int64_t>;
  constexpr int kMantissaBits = std::numeric_limits<T>::digits - 1;
  constexpr int kExponentBias = std::numeric_limits<T>::max_exponent - 1;
  constexpr int kTerms = std::is_same_v<T, float> ? 7 : 13;
  // 2^n stays normal for n in [1 - bias, bias]: the lower clamp keeps n > -bias, the upper n <= bias.
  constexpr T kLow = -static_cast<T>((kExponentBias - 1) * std::numbers::ln2);
  constexpr T kHigh = static_cast<T>(kExponentBias * std::numbers::ln2);
  // Adding 1.5 * 2^mantissa_bits rounds to an integer (the fraction bits fall off); subtracting it
  // again gives n as a T.
  constexpr T kRound = T(1.5) * static_cast<T>(Bits{1} << kMantissaBits);

  x = std::min(std::max(x, kLow), kHigh);
  const T shifted = x * std::numbers::log2e_v<T> + kRound;  // n sits in its low mantissa bits
  const T n = shifted - kRound;
  const T r = (x - n * Ln2Split<T>::hi) - n * Ln2Split<T>::lo;
  T p = T(1);  // Horner form of the Taylor series: 1 + r (1 + r/2 (1 + r/3 (...)))
  for (int k = kTerms; k >= 1; --k) p = T(1) + p * r * (T(1) / static_cast<T>(k));
  // 2^n from the integer in shifted's bits rather than a float -> int conversion of n: the same
  // value for every finite x, and a NaN x (whose p is NaN, so the result is) converts nothing, which
  // would be undefined behaviour (UBSan's finding). Unsigned, so a NaN's arbitrary bits wrap.
  using UBits = std::make_unsigned_t<Bits>;
  const UBits n_bits = std::bit_cast<UBits>(shifted) - std::bit_cast<UBits>(kRound);
  const UBits two_to_n = (n_bits + static_cast<UBits>(kExponentBias)) << kMantissaBits;
  return p * std::bit_cast<T>(two_to_n);
}

// exp for softmax arguments (x <= 0, possibly -inf from masking): exactly 0 below the normal range,
// so fully masked entries contribute nothing, exp_saturating otherwise.
template <typename T>
inline T fast_exp(T x) {
  constexpr T kMin = -static_cast<T>((std::numeric_limits<T>::max_exponent - 2) * std::numbers::ln2);
  return x < kMin ? T(0) : exp_saturating(x);
}

}  // namespace megaton::kernels::detail
