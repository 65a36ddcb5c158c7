#include "megaton/kernels/cpu/gemv.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "finite_diff.h"
#include "megaton/kernels/cpu/linear.h"
#include "megaton/kernels/decode_rows.h"

using namespace megaton;
using namespace megaton::kernels::cpu;

namespace {

float widen(float v) { return v; }
float widen(BFloat16 v) { return bf16_to_float(v.bits); }

template <typename T>
std::vector<T> random_as(size_t n, uint64_t seed) {
  std::vector<T> out;
  for (float v : fd::random_vector<float>(n, seed)) {
    if constexpr (std::is_same_v<T, BFloat16>)
      out.push_back(BFloat16{float_to_bf16(v)});
    else
      out.push_back(v);
  }
  return out;
}

std::vector<GemvPath> paths() {
  std::vector<GemvPath> p = {GemvPath::Portable};
  if (gemv_simd_compiled()) p.push_back(GemvPath::Simd);
  return p;
}

// Odd shapes: one element, one row, K below / not a multiple of the 8-lane vector and of the
// 32-element unrolled step, and one large enough to run on several threads.
const std::vector<std::pair<int64_t, int64_t>> kShapes = {{1, 1},   {7, 1},    {8, 3},    {31, 5},
                                                          {33, 17}, {100, 1},  {257, 129}, {768, 301}};

// y = W x + bias against a double reference over the stored (widened) values. Each error is
// bounded by fp32 accumulation over sum |w x| plus, for a bf16 y, the final rounding.
template <typename T, typename W, typename B>
void expect_matches_double(GemvPath path) {
  for (auto [in, out] : kShapes) {
    const auto x = random_as<T>(in, 1);
    const auto bias = random_as<B>(out, 3);
    const auto w = random_as<W>(in * out, 2);
    std::vector<T> y(out);
    gemv(y.data(), x.data(), w.data(), bias.data(), 1, in, out, path);
    for (int64_t r = 0; r < out; ++r) {
      double want = widen(bias[r]), mag = std::abs(want);
      for (int64_t i = 0; i < in; ++i) {
        want += double(widen(w[r * in + i])) * widen(x[i]);
        mag += std::abs(double(widen(w[r * in + i])) * widen(x[i]));
      }
      const double got = widen(y[r]);
      const double tol = 1e-6 * mag + (std::is_same_v<T, BFloat16> ? std::abs(want) / 256 : 0.0);
      ASSERT_TRUE(std::isfinite(got)) << "in " << in << " out " << out << " row " << r;
      ASSERT_NEAR(got, want, tol) << "in " << in << " out " << out << " row " << r;
    }
  }
}

}  // namespace

TEST(Gemv, MatchesDoubleReferenceOnOddShapes) {
  for (GemvPath p : paths()) {
    SCOPED_TRACE(p == GemvPath::Simd ? "simd" : "portable");
    expect_matches_double<float, float, float>(p);
    expect_matches_double<float, BFloat16, float>(p);
    expect_matches_double<BFloat16, BFloat16, float>(p);
    expect_matches_double<BFloat16, BFloat16, BFloat16>(p);
  }
}

TEST(Gemv, BitwiseIndependentOfTheThreadCount) {
  const int64_t in = 1000, out = 333;
  const auto x = fd::random_vector<float>(in, 4), w = fd::random_vector<float>(in * out, 5);
  std::vector<float> one(out), two(out);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  gemv(one.data(), x.data(), w.data(), static_cast<const float*>(nullptr), 1, in, out);
  omp_set_num_threads(2);
  gemv(two.data(), x.data(), w.data(), static_cast<const float*>(nullptr), 1, in, out);
  omp_set_num_threads(saved);
  EXPECT_EQ(std::memcmp(one.data(), two.data(), sizeof(float) * out), 0);
}

// A NaN or infinity reaches exactly the outputs that read it: one in x every row, one in W its row.
TEST(Gemv, NonFiniteInputsPropagate) {
  const int64_t in = 45, out = 6;
  for (GemvPath p : paths()) {
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      auto x = fd::random_vector<float>(in, 6), w = fd::random_vector<float>(in * out, 7);
      std::vector<float> y(out);
      w[3 * in + 44] = bad;  // the scalar tail of row 3
      w[4 * in + 9] = bad;   // the vector body of row 4
      gemv(y.data(), x.data(), w.data(), static_cast<const float*>(nullptr), 1, in, out, p);
      for (int64_t r = 0; r < out; ++r) EXPECT_EQ(std::isfinite(y[r]), r != 3 && r != 4) << r;
      x[40] = std::numeric_limits<float>::quiet_NaN();
      gemv(y.data(), x.data(), w.data(), static_cast<const float*>(nullptr), 1, in, out, p);
      for (int64_t r = 0; r < out; ++r) EXPECT_TRUE(std::isnan(y[r])) << r;
    }
  }
}

// linear_forward of up to kDecodeRows rows is the GEMV, each row with the bits of a one-row call
// (what speculative verification relies on); of more rows the GEMM, which agrees within rounding.
// Planted: the GEMV's x offset per row left at row 0 (caught).
TEST(Gemv, LinearForwardOfAFewRowsIsTheOneRowGemvOfEach) {
  const int64_t in = 96, out = 70, many = kernels::kDecodeRows + 1;
  const auto x = fd::random_vector<float>(many * in, 8), w = fd::random_vector<float>(in * out, 9);
  const auto bias = fd::random_vector<float>(out, 10);
  std::vector<float> few(kernels::kDecodeRows * out), gemm(many * out), one(out);
  linear_forward(few.data(), x.data(), w.data(), bias.data(), kernels::kDecodeRows, in, out);
  linear_forward(gemm.data(), x.data(), w.data(), bias.data(), many, in, out);
  for (int64_t n = 0; n < kernels::kDecodeRows; ++n) {
    gemv(one.data(), x.data() + n * in, w.data(), bias.data(), 1, in, out);
    EXPECT_EQ(std::memcmp(one.data(), few.data() + n * out, sizeof(float) * out), 0) << "row " << n;
    for (int64_t r = 0; r < out; ++r) EXPECT_NEAR(one[r], gemm[n * out + r], 1e-5) << n << "," << r;
  }
}

// A multi-row call widens each weight register once for a group of x rows (gemv_dot.h's dot_lanes)
// and must still give every row the bits of a one-row call, for every weight / activation pair and
// on K with a main loop, single steps and a scalar tail; seven rows run as groups of four and three
// (AVX-512) or three of two and one (AVX2). Planted: the single steps taken for the group's first row only (caught).
template <typename T, typename W>
void expect_rows_are_one_row_calls() {
  const int64_t in = 203, out = 37, rows = 7;
  const auto x = random_as<T>(rows * in, 11);
  const auto w = random_as<W>(in * out, 12);
  std::vector<T> all(rows * out), one(out);
  gemv(all.data(), x.data(), w.data(), static_cast<const float*>(nullptr), rows, in, out);
  for (int64_t n = 0; n < rows; ++n) {
    gemv(one.data(), x.data() + n * in, w.data(), static_cast<const float*>(nullptr), 1, in, out);
    EXPECT_EQ(std::memcmp(one.data(), all.data() + n * out, sizeof(T) * out), 0) << "row " << n;
  }
}

TEST(Gemv, EveryRowOfAGroupHasTheBitsOfAOneRowCall) {
  expect_rows_are_one_row_calls<float, float>();
  expect_rows_are_one_row_calls<float, BFloat16>();
  expect_rows_are_one_row_calls<BFloat16, BFloat16>();
}
