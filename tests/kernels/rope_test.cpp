#include "megaton/kernels/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <numbers>
#include <vector>

#include "finite_diff.h"

using namespace megaton;
using namespace megaton::kernels;

namespace {

constexpr int64_t kB = 2, kT = 17, kH = 6, kHkv = 2, kD = 24;
// A fused QKV token in Megatron's per-query-group layout: per kv group, its kH / kHkv q heads, its
// k head and its v head.
constexpr int64_t kGroup = (kH / kHkv + 2) * kD;
constexpr int64_t kStride = kHkv * kGroup;
constexpr int64_t kOffset = 5;  // positions kOffset .. kOffset + kT - 1

// Pair (a, b) of head dimension i as the complex number a + ib, multiplied by exp(i pos inv_freq);
// rotates the head at `offset` in every fused token.
void rotate_reference(double* x, int64_t offset, const std::vector<double>& inv_freq, RopeLayout layout) {
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t t = 0; t < kT; ++t) {
      double* head = x + (b * kT + t) * kStride + offset;
      for (int64_t i = 0; i < kD / 2; ++i) {
        const int64_t i0 = layout == RopeLayout::Half ? i : 2 * i;
        const int64_t i1 = layout == RopeLayout::Half ? i + kD / 2 : 2 * i + 1;
        const std::complex<double> z =
            std::complex<double>(head[i0], head[i1]) * std::polar(1.0, (kOffset + t) * inv_freq[i]);
        head[i0] = z.real();
        head[i1] = z.imag();
      }
    }
}

struct Tables {
  std::vector<double> cos, sin;
};

Tables make_tables(const std::vector<double>& inv_freq) {
  Tables tab{std::vector<double>((kOffset + kT) * kD / 2), std::vector<double>((kOffset + kT) * kD / 2)};
  rope_tables(tab.cos.data(), tab.sin.data(), kOffset + kT, kD, inv_freq);
  return tab;
}

// Rotate the q heads and the k heads of a fused QKV buffer of B sequences in place: per group, its
// q heads and the k head right after them.
template <typename T>
void apply_qk(std::vector<T>& qkv, const T* cos, const T* sin, RopeLayout layout, bool inverse) {
  const int64_t B = static_cast<int64_t>(qkv.size()) / (kT * kStride);
  rope_apply(qkv.data(), cos, sin, B, kT, kHkv, kH / kHkv + 1, kD, {kStride, kGroup}, kOffset, layout, inverse);
}

}  // namespace

TEST(Rope, InvFreqWithoutScalingIsThetaPower) {
  auto inv = rope_inv_freq(kD, 10000.0, RopeScaling{});
  ASSERT_EQ(inv.size(), static_cast<size_t>(kD / 2));
  for (int64_t i = 0; i < kD / 2; ++i) EXPECT_DOUBLE_EQ(inv[i], std::pow(10000.0, -2.0 * i / kD));
}

// Llama 3.2 settings. The expectation is written in the frequency domain (periods per original
// context, r = original / wavelen) instead of the kernel's wavelength comparisons.
TEST(Rope, InvFreqLlama3ScalingMatchesIndependentFormula) {
  const double theta = 500000.0, factor = 32.0, low = 1.0, high = 4.0, original = 8192.0;
  const int64_t D = 64;
  auto inv = rope_inv_freq(D, theta, RopeScaling{factor, low, high, original});
  int kept = 0, divided = 0, blended = 0;
  for (int64_t i = 0; i < D / 2; ++i) {
    const double f = std::exp(-std::log(theta) * 2.0 * i / D);
    const double r = original * f / (2.0 * std::numbers::pi);
    double want;
    if (r > high) {
      want = f, ++kept;
    } else if (r < low) {
      want = f / factor, ++divided;
    } else {
      const double alpha = (r - low) / (high - low);  // 0 at the low edge, 1 at the high edge
      want = f * (alpha + (1.0 - alpha) / factor), ++blended;
    }
    EXPECT_NEAR(inv[i], want, 1e-14 * want) << i;
  }
  // All three regimes occur for these settings.
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  EXPECT_DOUBLE_EQ(inv[D / 2 - 1], std::pow(theta, -62.0 / 64.0) / 32.0);
}

TEST(Rope, TablesHoldCosSinOfPositionTimesFrequency) {
  auto inv = rope_inv_freq(kD, 10000.0, RopeScaling{});
  Tables tab = make_tables(inv);
  for (int64_t t = 0; t < kOffset + kT; ++t)
    for (int64_t i = 0; i < kD / 2; ++i) {
      EXPECT_DOUBLE_EQ(tab.cos[t * kD / 2 + i], std::cos(t * inv[i]));
      EXPECT_DOUBLE_EQ(tab.sin[t * kD / 2 + i], std::sin(t * inv[i]));
    }
}

// Both layouts against an explicit complex rotation, in double and in float; v heads stay
// untouched; the inverse restores the input.
TEST(Rope, ApplyMatchesComplexRotationAndInverseRestores) {
  auto inv = rope_inv_freq(kD, 10000.0, RopeScaling{});
  Tables tab = make_tables(inv);
  std::vector<float> cosf(tab.cos.begin(), tab.cos.end()), sinf(tab.sin.begin(), tab.sin.end());
  for (RopeLayout layout : {RopeLayout::Half, RopeLayout::Interleaved}) {
    const auto input = fd::random_vector(kB * kT * kStride, 1);
    std::vector<double> want = input;
    for (int64_t g = 0; g < kHkv; ++g) {
      for (int64_t h = 0; h < kH / kHkv; ++h) rotate_reference(want.data(), g * kGroup + h * kD, inv, layout);  // q
      rotate_reference(want.data(), g * kGroup + kH / kHkv * kD, inv, layout);                                  // k
    }

    std::vector<double> got = input;
    apply_qk(got, tab.cos.data(), tab.sin.data(), layout, /*inverse=*/false);
    std::vector<float> gotf(input.begin(), input.end());
    apply_qk(gotf, cosf.data(), sinf.data(), layout, /*inverse=*/false);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-14) << i;
      EXPECT_NEAR(gotf[i], want[i], 1e-6) << i;
    }

    apply_qk(got, tab.cos.data(), tab.sin.data(), layout, /*inverse=*/true);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], input[i], 1e-14) << i;
  }
}

// Loss = sum(dout * rope(x)); the backward is the inverse rotation of dout (v heads pass through).
// One sequence keeps the O(size^2) finite differences cheap; batching is covered above.
TEST(Rope, InverseIsGradientByFiniteDifferences) {
  auto inv = rope_inv_freq(kD, 500000.0, RopeScaling{8.0, 1.0, 4.0, 64.0});
  Tables tab = make_tables(inv);
  for (RopeLayout layout : {RopeLayout::Half, RopeLayout::Interleaved}) {
    auto x = fd::random_vector(kT * kStride, 2);
    auto dout = fd::random_vector(x.size(), 3);
    std::vector<double> out;
    auto loss = [&] {
      out = x;
      apply_qk(out, tab.cos.data(), tab.sin.data(), layout, /*inverse=*/false);
      return fd::dot(dout, out);
    };
    std::vector<double> dx = dout;
    apply_qk(dx, tab.cos.data(), tab.sin.data(), layout, /*inverse=*/true);
    EXPECT_TRUE(fd::close(dx, fd::numeric_gradient(x, loss), 1e-8));
  }
}
