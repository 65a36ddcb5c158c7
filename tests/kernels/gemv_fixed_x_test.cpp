// int8 per-row GEMVs against x in fixed point (cpu/gemv_fixed_x.h): within x's own rounding of the
// double reference, the same bits on the portable and SIMD paths (the sums are exact integers), no
// int32 overflow over long rows of extreme codes, and non-finite x carried into y.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "finite_diff.h"
#include "megaton/kernels/cpu/gemv_quantized.h"

using namespace megaton;
using namespace megaton::kernels;

namespace {

struct Int8Weight {
  int64_t in, out;
  std::vector<int8_t> codes;
  std::vector<float> scales;
  cpu::QuantizedRows rows() const { return {codes.data(), DType::I8, scales.data(), 1, in}; }
  double value(int64_t r, int64_t c) const { return double(codes[size_t(r * in + c)]) * scales[size_t(r)]; }
};

// Random codes over the whole int8 range, -128 included (a loaded file may hold it).
Int8Weight random_weight(int64_t in, int64_t out, uint64_t seed) {
  Int8Weight w{in, out, {}, {}};
  for (float v : fd::random_vector<float>(size_t(in * out), seed, -128.0, 128.0))
    w.codes.push_back(static_cast<int8_t>(std::clamp(std::floor(v), -128.0f, 127.0f)));
  for (float v : fd::random_vector<float>(size_t(out), seed + 1, 0.001, 0.02)) w.scales.push_back(v);
  return w;
}

std::vector<cpu::GemvPath> paths() {
  std::vector<cpu::GemvPath> p = {cpu::GemvPath::Portable};
  if (cpu::gemv_simd_compiled()) p.push_back(cpu::GemvPath::Simd);
  return p;
}

// y for x rows [rows, in] on one path.
std::vector<float> gemv(const Int8Weight& w, const std::vector<float>& x, int64_t rows, cpu::GemvPath p,
                        const float* bias = nullptr) {
  std::vector<float> y(size_t(rows * w.out));
  cpu::gemv_quantized(y.data(), x.data(), w.rows(), bias, rows, w.in, w.out, p);
  return y;
}

// |y - reference| within x's rounding (half of 2^-30 of the row's largest |x| per element, times
// sum |w|) plus the final conversions' (a few fp32 roundings of sum |w x|).
void expect_near_reference(const Int8Weight& w, const std::vector<float>& x, int64_t rows,
                           const std::vector<float>& y) {
  for (int64_t n = 0; n < rows; ++n) {
    double amax = 0;
    for (int64_t c = 0; c < w.in; ++c) amax = std::max(amax, std::abs(double(x[size_t(n * w.in + c)])));
    for (int64_t r = 0; r < w.out; ++r) {
      double want = 0, mag = 0, wsum = 0;
      for (int64_t c = 0; c < w.in; ++c) {
        const double p = w.value(r, c) * x[size_t(n * w.in + c)];
        want += p;
        mag += std::abs(p);
        wsum += std::abs(w.value(r, c));
      }
      const float got = y[size_t(n * w.out + r)];
      ASSERT_TRUE(std::isfinite(got)) << n << "," << r;
      ASSERT_NEAR(got, want, std::ldexp(wsum * amax, -31) + 3e-7 * mag) << "x row " << n << " weight row " << r;
    }
  }
}

}  // namespace

// Odd lengths (the scalar tail), one longer than a flush of the int32 lanes, x rows of one to four
// (decode's pairs, and the few-row groups), and x with a 1e4 outlier among values near 1e-3: the
// reference within x's rounding, and the portable and SIMD paths bitwise equal (planted: lo taken as
// x & 0x3fff, caught by the reference; the tail's codes skipped on the SIMD path, caught by both).
TEST(GemvFixedX, ExactSumsWithinTheRoundingOfX) {
  for (const int64_t in : {int64_t{1}, int64_t{37}, int64_t{64}, int64_t{300}, int64_t{4096 + 97}}) {
    const Int8Weight w = random_weight(in, 9, uint64_t(in));
    for (const int64_t rows : {int64_t{1}, int64_t{3}, int64_t{4}}) {
      auto x = fd::random_vector<float>(size_t(rows * in), uint64_t(in + rows), -1e-3, 1e-3);
      x[size_t(in / 2)] = 1e4f;
      std::vector<std::vector<float>> ys;
      for (cpu::GemvPath p : paths()) {
        ys.push_back(gemv(w, x, rows, p));
        expect_near_reference(w, x, rows, ys.back());
      }
      if (ys.size() == 2) {
        EXPECT_EQ(std::memcmp(ys[0].data(), ys[1].data(), sizeof(float) * ys[0].size()), 0) << in;
      }
    }
  }
}

// The largest sums the lanes can meet: every code at +127 or -128 and every x at the row's largest
// |x| over 20000 columns. Each int32 lane would pass 2^31 without the flush into int64 every
// kFixedFlush codes (planted: flush every 2^20 codes, caught).
TEST(GemvFixedX, ExtremeCodesOverLongRowsDoNotOverflow) {
  const int64_t in = 20000, out = 2;
  Int8Weight w{in, out, std::vector<int8_t>(size_t(in), 127), {1.0f, 1.0f}};
  w.codes.resize(size_t(in * out), -128);
  const std::vector<float> x(size_t(in), -3.0f);
  for (cpu::GemvPath p : paths()) {
    const auto y = gemv(w, x, 1, p);
    EXPECT_FLOAT_EQ(y[0], -3.0f * 127 * in);
    EXPECT_FLOAT_EQ(y[1], 3.0f * 128 * in);
  }
}

// x all zero gives y = bias exactly; a NaN or an infinity in x reaches every row it multiplies
// (planted: the non-finite check dropped, caught: the fixed point has no NaN).
TEST(GemvFixedX, ZeroAndNonFiniteX) {
  const Int8Weight w = random_weight(70, 5, 3);
  const auto bias = fd::random_vector<float>(5, 4);
  for (cpu::GemvPath p : paths()) {
    const auto y = gemv(w, std::vector<float>(70, 0.0f), 1, p, bias.data());
    EXPECT_EQ(std::memcmp(y.data(), bias.data(), sizeof(float) * 5), 0);
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      auto x = fd::random_vector<float>(70, 5);
      x[11] = bad;
      for (int64_t r = 0; r < 5; ++r) {
        const float got = gemv(w, x, 1, p)[size_t(r)];
        if (w.codes[size_t(r * 70 + 11)] != 0) {
          EXPECT_FALSE(std::isfinite(got)) << r;
        }
      }
    }
  }
}
