// FP8 formats on their own terms (the bit-exact comparison with CUDA's conversions is in
// cuda_fp8_reference_test.cpp): published extremes, every code round-trips, rounding is to nearest
// even at representative ties, and overflow follows the chosen rule.
#include "megaton/core/fp8_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace megaton::fp8 {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(Fp8Format, PublishedExtremes) {
  EXPECT_EQ(decode(0x7e, Format::E4M3), 448.0f);
  EXPECT_EQ(decode(0x01, Format::E4M3), std::ldexp(1.0f, -9));   // smallest subnormal
  EXPECT_EQ(decode(0x08, Format::E4M3), std::ldexp(1.0f, -6));   // smallest normal
  EXPECT_TRUE(std::isnan(decode(0x7f, Format::E4M3)));
  EXPECT_TRUE(std::isnan(decode(0xff, Format::E4M3)));
  EXPECT_EQ(decode(0x7b, Format::E5M2), 57344.0f);
  EXPECT_EQ(decode(0x01, Format::E5M2), std::ldexp(1.0f, -16));
  EXPECT_EQ(decode(0x7c, Format::E5M2), kInf);
  EXPECT_EQ(decode(0xfc, Format::E5M2), -kInf);
  EXPECT_TRUE(std::isnan(decode(0x7d, Format::E5M2)));
  EXPECT_EQ(info(Format::E4M3).max, 448.0f);
  EXPECT_EQ(info(Format::E5M2).max, 57344.0f);
}

TEST(Fp8Format, EveryFiniteCodeRoundTrips) {
  for (Format f : {Format::E4M3, Format::E5M2})
    for (int c = 0; c < 256; ++c) {
      const float v = decode(static_cast<uint8_t>(c), f);
      if (!std::isfinite(v)) continue;
      const uint8_t back = encode(v, f);
      // -0 and +0 are distinct codes and both round-trip.
      EXPECT_EQ(back, c) << info(f).name << " code " << c << " value " << v;
    }
}

TEST(Fp8Format, RoundsToNearestEven) {
  // E4M3 around 1: spacing 1/8. 1 + 1/16 ties to 1 (even mantissa), 1 + 3/16 to 1.25.
  EXPECT_EQ(decode(encode(1.0625f, Format::E4M3), Format::E4M3), 1.0f);
  EXPECT_EQ(decode(encode(1.1875f, Format::E4M3), Format::E4M3), 1.25f);
  EXPECT_EQ(decode(encode(1.0626f, Format::E4M3), Format::E4M3), 1.125f);
  // Subnormal ties: half the smallest E4M3 subnormal rounds to zero, 1.5 units ties to 2 units.
  EXPECT_EQ(encode(std::ldexp(1.0f, -10), Format::E4M3), 0x00);
  EXPECT_EQ(encode(std::ldexp(3.0f, -10), Format::E4M3), 0x02);
  // Half a unit above the last subnormal (7) ties to the first normal (8, even).
  EXPECT_EQ(encode(std::ldexp(15.0f, -10), Format::E4M3), 0x08);
  // E5M2 around 1: spacing 1/4.
  EXPECT_EQ(decode(encode(1.125f, Format::E5M2), Format::E5M2), 1.0f);
  EXPECT_EQ(decode(encode(-1.375f, Format::E5M2), Format::E5M2), -1.5f);
}

TEST(Fp8Format, OverflowSaturatesOrGoesNonFinite) {
  EXPECT_EQ(encode(464.0f, Format::E4M3, Overflow::NonFinite), 0x7e);  // a tie, down to the even 448
  EXPECT_EQ(encode(480.0f, Format::E4M3, Overflow::Saturate), 0x7e);
  EXPECT_EQ(encode(480.0f, Format::E4M3, Overflow::NonFinite), 0x7f);
  EXPECT_EQ(encode(-kInf, Format::E4M3, Overflow::Saturate), 0xfe);
  EXPECT_EQ(encode(61440.0f, Format::E5M2, Overflow::NonFinite), 0x7c);
  EXPECT_EQ(encode(61440.0f, Format::E5M2, Overflow::Saturate), 0x7b);
  EXPECT_EQ(encode(kInf, Format::E5M2, Overflow::NonFinite), 0x7c);
  EXPECT_EQ(encode(std::numeric_limits<float>::quiet_NaN(), Format::E5M2), 0x7f);
  EXPECT_EQ(encode(-std::numeric_limits<float>::quiet_NaN(), Format::E4M3), 0x7f);
}

TEST(Fp8Format, E8M0RoundsUp) {
  EXPECT_EQ(e8m0_from_float(1.0f), 127);
  EXPECT_EQ(e8m0_from_float(1.5f), 128);
  EXPECT_EQ(e8m0_from_float(0.25f), 125);
  EXPECT_EQ(e8m0_from_float(0.0f), 0);
  EXPECT_EQ(e8m0_from_float(std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(e8m0_from_float(std::numeric_limits<float>::quiet_NaN()), 0xff);
  EXPECT_EQ(e8m0_to_float(130), 8.0f);
  EXPECT_TRUE(std::isnan(e8m0_to_float(0xff)));
}

TEST(Fp8Format, NamesParse) {
  EXPECT_EQ(format_from_name("e4m3"), Format::E4M3);
  EXPECT_EQ(format_from_name("e5m2"), Format::E5M2);
  EXPECT_THROW(format_from_name("e3m4"), std::exception);
  EXPECT_EQ(format_of_dtype(dtype_of_format(Format::E5M2)), Format::E5M2);
  EXPECT_EQ(dtype_name(DType::F8E4M3), "f8e4m3");
  EXPECT_THROW(format_of_dtype(DType::U8), std::exception);
}

}  // namespace
}  // namespace megaton::fp8
