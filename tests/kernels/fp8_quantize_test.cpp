// FP8 quantisation granularities and scales (kernels/fp8_quantize.h) against the independent numpy reference
// (tests/python/fp8_reference.py, whose result is committed in data/fp8_recipes_fixture.json and
// re-checked by selftest_fp8_fixture.py), plus the error bound every granularity must meet.
#include "../support/host_tensors.h"
#include "megaton/kernels/fp8_quantize.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

using megaton::testing::transposed;

namespace megaton::kernels {
namespace {

// The reference's fixture_matrix(), the same integer hash.
Tensor fixture_matrix(int64_t rows, int64_t cols) {
  Tensor x = Tensor::empty({rows, cols}, DType::F32, MemCategory::Other, "fixture");
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      uint32_t u = static_cast<uint32_t>(static_cast<uint64_t>(i) * 2654435761u + static_cast<uint64_t>(j) * 40503u + 12345u);
      u ^= u >> 13;
      u *= 0x5bd1e995u;
      u ^= u >> 15;
      const int64_t mant = static_cast<int64_t>(u & 0xfffffu) - (1 << 19);
      const int e = static_cast<int>((u >> 20) % 16) - 30 + static_cast<int>(i % 7) * 3;
      x.data<float>()[i * cols + j] = i == 5 ? 0.0f : std::ldexp(static_cast<float>(mant), e);
    }
  return x;
}

Fp8Granularity granularity_from(const std::string& name) {
  for (Fp8Granularity g : {Fp8Granularity::Tensor, Fp8Granularity::Tile1x128, Fp8Granularity::Block128x128, Fp8Granularity::Mx1x32})
    if (granularity_name(g) == name) return g;
  throw std::runtime_error("fixture granularity " + name);
}

std::string fnv1a64(const uint8_t* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

TEST(Fp8Scale, CurrentScaleFromAmax) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(fp8_scale_from_amax(2.0f, 448.0f), 224.0f);
  EXPECT_EQ(fp8_scale_from_amax(3.0f, 448.0f, /*pow2=*/true), 128.0f);  // 149.33 rounded down
  EXPECT_EQ(fp8_scale_from_amax(0.0f, 448.0f), 1.0f);
  EXPECT_EQ(fp8_scale_from_amax(kInf, 448.0f), 1.0f);
  EXPECT_EQ(fp8_scale_from_amax(std::numeric_limits<float>::quiet_NaN(), 448.0f), 1.0f);
  EXPECT_EQ(fp8_scale_from_amax(1e-45f, 448.0f), std::numeric_limits<float>::max());
  EXPECT_EQ(fp8_scale_from_amax(1e-9f, 448.0f, false, /*epsilon=*/1.0f), 448.0f);
  // Block amax 500 over E4M3: 500 / 448 rounds up to 2, so the largest element maps to 250 <= 448.
  EXPECT_EQ(mx_scale_code(500.0f, 448.0f), 128);
  EXPECT_EQ(mx_scale_code(448.0f, 448.0f), 127);
}

TEST(Fp8Quantize, MatchesTheNumpyReference) {
  std::ifstream in(std::string(MEGATON_SOURCE_DIR) + "/tests/kernels/data/fp8_recipes_fixture.json");
  ASSERT_TRUE(in) << "fixture missing";
  const nlohmann::json fixture = nlohmann::json::parse(in);
  const Tensor x = fixture_matrix(fixture["rows"], fixture["cols"]);
  for (const auto& c : fixture["cases"]) {
    Fp8QuantizeOptions o;
    o.format = fp8::format_from_name(c["format"].get<std::string>());
    o.granularity = granularity_from(c["granularity"]);
    o.pow2_scales = c["pow2"];
    if (!c["scale"].is_null()) o.scale = c["scale"].get<float>();
    const std::string what = c["format"].get<std::string>() + " " + c["granularity"].get<std::string>() + (o.pow2_scales ? " pow2" : "");
    const Fp8Matrix q = fp8_quantize(x, o);
    const auto& scales = c["scale_inv"];
    ASSERT_EQ(static_cast<int64_t>(scales.size()), q.scale_inv.numel()) << what;
    for (size_t t = 0; t < scales.size(); ++t) {
      if (o.granularity == Fp8Granularity::Mx1x32) EXPECT_EQ(q.scale_inv.data<uint8_t>()[t], scales[t].get<int>()) << what << " tile " << t;
      else EXPECT_EQ(q.scale_inv.data<float>()[t], scales[t].get<float>()) << what << " tile " << t;
    }
    const auto* codes = static_cast<const uint8_t*>(q.data.raw());
    char head[129];
    for (int i = 0; i < 64; ++i) std::snprintf(head + 2 * i, 3, "%02x", codes[i]);
    EXPECT_EQ(std::string(head), c["codes_head"].get<std::string>()) << what;
    EXPECT_EQ(fnv1a64(codes, static_cast<size_t>(q.data.numel())), c["codes_fnv1a64"].get<std::string>()) << what;
  }
}

TEST(Fp8Quantize, DequantisedErrorIsWithinHalfAStepOfTheTile) {
  const Tensor x = fixture_matrix(130, 300);
  for (Fp8Granularity g : {Fp8Granularity::Tensor, Fp8Granularity::Tile1x128, Fp8Granularity::Block128x128, Fp8Granularity::Mx1x32}) {
    Fp8QuantizeOptions o;
    o.granularity = g;
    const Fp8Matrix q = fp8_quantize(x, o);
    const Tensor back = fp8_dequantize(q);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float v = x.data<float>()[i], d = back.data<float>()[i];
      ASSERT_TRUE(std::isfinite(d));
      // Relative 2^-4 (E4M3's half step) for values in the normal range of their tile; below it the
      // absolute error is at most half the tile's smallest subnormal step, itself below 2^-4 of
      // the tile's amax / 2^6.
      const int64_t r = i / 300, c = i % 300;
      const int64_t tile_cols = q.scale_inv.size(1);
      const int64_t tr = g == Fp8Granularity::Tensor ? 0 : (g == Fp8Granularity::Block128x128 ? r / 128 : r);
      const int64_t tc = g == Fp8Granularity::Tensor ? 0 : c / (g == Fp8Granularity::Mx1x32 ? 32 : 128);
      const float scale_inv = g == Fp8Granularity::Mx1x32 ? std::ldexp(1.0f, q.scale_inv.data<uint8_t>()[tr * tile_cols + tc] - 127)
                                                       : q.scale_inv.data<float>()[tr * tile_cols + tc];
      const float tiny = std::ldexp(1.0f, -10) * scale_inv;  // half the smallest E4M3 subnormal, scaled back
      ASSERT_LE(std::fabs(d - v), std::max(std::fabs(v) * 0.0625f, tiny)) << granularity_name(g) << " element " << i;
    }
  }
}

TEST(Fp8Quantize, AmaxAndGivenScale) {
  Tensor x = Tensor::zeros({2, 3}, DType::F32);
  float* p = x.data<float>();
  p[0] = 1.0f, p[4] = -600.0f;
  Fp8QuantizeOptions o;
  o.scale = 0.5f;  // delayed scaling: the tensor's own amax (600) does not change the scale
  Fp8Matrix q = fp8_quantize(x, o);
  EXPECT_EQ(q.amax, 600.0f);
  EXPECT_EQ(q.scale_inv.data<float>()[0], 2.0f);
  EXPECT_EQ(fp8_dequantize(q).data<float>()[4], -576.0f);  // -300 -> -288 (E4M3 spacing 32 in [256, 448])
  p[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(fp8_quantize(x, o).amax));
  o.scale = std::numeric_limits<float>::infinity();
  EXPECT_THROW(fp8_quantize(x, o), std::exception);
  o.scale.reset();
  o.granularity = Fp8Granularity::Tile1x128;
  o.scale = 1.0f;
  EXPECT_THROW(fp8_quantize(x, o), std::exception);  // a given scale is per tensor only
}

void expect_same(const Fp8Matrix& a, const Fp8Matrix& b, const std::string& what) {
  ASSERT_EQ(a.data.shape(), b.data.shape()) << what;
  ASSERT_EQ(a.scale_inv.shape(), b.scale_inv.shape()) << what;
  EXPECT_EQ(std::memcmp(a.data.raw(), b.data.raw(), a.data.nbytes()), 0) << what;
  EXPECT_EQ(std::memcmp(a.scale_inv.raw(), b.scale_inv.raw(), a.scale_inv.nbytes()), 0) << what;
}

TEST(Fp8Quantize, TransposedQuantisationIsTheQuantisationOfTheTranspose) {
  const Tensor x = fixture_matrix(130, 300), xt = transposed(x);
  for (Fp8Granularity g : {Fp8Granularity::Tensor, Fp8Granularity::Tile1x128, Fp8Granularity::Block128x128, Fp8Granularity::Mx1x32}) {
    Fp8QuantizeOptions o{.granularity = g};
    const Fp8Matrix direct = fp8_quantize(xt, o);
    o.transpose = true;
    expect_same(fp8_quantize(x, o), direct, std::string(granularity_name(g)));
  }
}

TEST(Fp8Quantize, BlocksAndTensorsTransposeExactly) {
  const Tensor x = fixture_matrix(130, 300), xt = transposed(x);
  for (Fp8Granularity g : {Fp8Granularity::Tensor, Fp8Granularity::Block128x128}) {
    const Fp8Matrix q = fp8_quantize(x, {.granularity = g});
    // A 128x128 block grid is the same grid transposed, so re-quantising x^T gives the same codes.
    expect_same(fp8_transpose(q, "t"), fp8_quantize(xt, {.granularity = g}), std::string(granularity_name(g)));
  }
  EXPECT_THROW(fp8_transpose(fp8_quantize(x, {.granularity = Fp8Granularity::Tile1x128}), "t"), std::exception);
}

// The quantiser reads its source in 128 x 512 blocks; a matrix of several blocks each way, ragged at
// both edges, against a tile loop over the whole matrix written here from the definitions.
Fp8Matrix naive_quantize(const Tensor& x, Fp8Granularity g) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const Fp8TileShape t = fp8_tile_shape(g, rows, cols);
  const int64_t gr = (rows + t.rows - 1) / t.rows, gc = (cols + t.cols - 1) / t.cols;
  const bool mx = g == Fp8Granularity::Mx1x32;
  Fp8Matrix q;
  q.granularity = g;
  q.data = Tensor::empty({rows, cols}, DType::F8E4M3, MemCategory::Other, "naive");
  q.scale_inv = Tensor::empty({gr, gc}, mx ? DType::U8 : DType::F32, MemCategory::Other, "naive_scale_inv");
  for (int64_t i = 0; i < gr; ++i)
    for (int64_t j = 0; j < gc; ++j) {
      float amax = 0.0f;
      for (int64_t r = i * t.rows; r < std::min(rows, (i + 1) * t.rows); ++r)
        for (int64_t c = j * t.cols; c < std::min(cols, (j + 1) * t.cols); ++c)
          amax = std::max(amax, std::fabs(x.data<float>()[r * cols + c]));
      float scale;
      if (mx) {
        const uint8_t code = mx_scale_code(amax, 448.0f);
        q.scale_inv.data<uint8_t>()[i * gc + j] = code;
        scale = std::ldexp(1.0f, 127 - code);
      } else {
        scale = fp8_scale_from_amax(amax, 448.0f);
        q.scale_inv.data<float>()[i * gc + j] = 1.0f / scale;
      }
      for (int64_t r = i * t.rows; r < std::min(rows, (i + 1) * t.rows); ++r)
        for (int64_t c = j * t.cols; c < std::min(cols, (j + 1) * t.cols); ++c)
          static_cast<uint8_t*>(q.data.raw())[r * cols + c] = fp8::encode(x.data<float>()[r * cols + c] * scale, fp8::Format::E4M3);
    }
  return q;
}

TEST(Fp8Quantize, ManyBlocksBothLayoutsInOnePassMatchATileLoop) {
  const Tensor x = fixture_matrix(300, 1100), xt = transposed(x);
  for (Fp8Granularity g : {Fp8Granularity::Tensor, Fp8Granularity::Tile1x128, Fp8Granularity::Block128x128, Fp8Granularity::Mx1x32}) {
    const std::string what(granularity_name(g));
    const Fp8Layouts both = fp8_quantize_both(fp8_source(x), {.granularity = g}, "x", "xt");
    expect_same(both.rowwise, naive_quantize(x, g), what + " rowwise");
    expect_same(both.columnwise, naive_quantize(xt, g), what + " columnwise");
    expect_same(fp8_quantize(x, {.granularity = g}), both.rowwise, what + " single rowwise");
    expect_same(fp8_quantize(x, {.granularity = g, .transpose = true}), both.columnwise, what + " single columnwise");
    EXPECT_EQ(both.rowwise.amax, both.columnwise.amax);
  }
  // Delayed scaling's given scale, in both layouts: the columnwise codes are the rowwise ones transposed.
  const Fp8Layouts given = fp8_quantize_both(fp8_source(x), {.scale = 0.25f}, "x", "xt");
  expect_same(given.columnwise, fp8_transpose(given.rowwise, "t"), "given scale");
  EXPECT_EQ(given.rowwise.scale_inv.data<float>()[0], 4.0f);
}

TEST(Fp8Quantize, StripeByStripeIsTheWholeQuantisation) {
  // As an FP8 GEMM's epilogue hands rows over: two full stripes and a ragged one. Tiles and blocks
  // encode each stripe as it comes; per-tensor current scaling waits for the whole amax.
  const Tensor x = fixture_matrix(300, 1100), xt = transposed(x);
  const auto stripes = [&](const Fp8QuantizeOptions& o) {
    Fp8StripeQuantizer q(fp8_source(x), o, true, true, "x", "xt");
    for (int64_t r0 = 0; r0 < 300; r0 += kFp8StripeRows) q.rows(r0, std::min<int64_t>(300, r0 + kFp8StripeRows));
    return q.finish();
  };
  for (Fp8Granularity g :
       {Fp8Granularity::Tensor, Fp8Granularity::Tile1x128, Fp8Granularity::Block128x128, Fp8Granularity::Mx1x32}) {
    const std::string what(granularity_name(g));
    const Fp8Layouts both = stripes({.granularity = g});
    expect_same(both.rowwise, naive_quantize(x, g), what + " rowwise");
    expect_same(both.columnwise, naive_quantize(xt, g), what + " columnwise");
    EXPECT_EQ(both.rowwise.amax, fp8_quantize(x, {.granularity = g}).amax) << what;
  }
  const Fp8Layouts given = stripes({.scale = 0.25f});
  expect_same(given.rowwise, fp8_quantize(x, {.scale = 0.25f}), "given scale");
  expect_same(given.columnwise, fp8_transpose(given.rowwise, "t"), "given scale columnwise");
  EXPECT_EQ(given.rowwise.amax, fp8_quantize(x, {}).amax);
}

TEST(Fp8Quantize, StripesOutOfOrderAreRefused) {
  const Tensor x = fixture_matrix(300, 64);
  const auto fresh = [&] { return Fp8StripeQuantizer(fp8_source(x), {}, true, true, "x", "xt"); };
  EXPECT_THROW(fresh().rows(128, 256), std::exception);  // skips the first stripe
  EXPECT_THROW(fresh().rows(0, 100), std::exception);    // ends inside a stripe
  EXPECT_THROW(fresh().rows(0, 301), std::exception);    // past the last row
  EXPECT_THROW(fresh().finish(), std::exception);        // before the last row
  Fp8StripeQuantizer q = fresh();
  q.rows(0, 256);                                // several stripes at once are fine
  EXPECT_THROW(q.rows(0, 128), std::exception);  // again
  q.rows(256, 300);
  EXPECT_EQ(q.finish().rowwise.data.size(0), 300);
}

TEST(Fp8Quantize, ANanInsideWideRowsReachesTheAmaxAndItsTilesScales) {
  // The amax sweeps run 16 columns at a time and whole columns for x^T's tiles: a NaN in the middle
  // of a wide matrix must still reach the tensor's amax and its own tiles' scales (unit scale, as
  // fp8_scale_from_amax keeps for a NaN amax), in both layouts.
  Tensor x = fixture_matrix(130, 300);
  x.data<float>()[129 * 300 + 17] = std::numeric_limits<float>::quiet_NaN();
  for (Fp8Granularity g : {Fp8Granularity::Tensor, Fp8Granularity::Tile1x128, Fp8Granularity::Block128x128}) {
    const std::string what(granularity_name(g));
    const Fp8Layouts both = fp8_quantize_both(fp8_source(x), {.granularity = g}, "x", "xt");
    EXPECT_TRUE(std::isnan(both.rowwise.amax)) << what;
    EXPECT_TRUE(std::isnan(both.columnwise.amax)) << what;
    EXPECT_EQ(both.rowwise.scale_inv_at(129, 17), 1.0f) << what;
    EXPECT_EQ(both.columnwise.scale_inv_at(17, 129), 1.0f) << what;
    if (g == Fp8Granularity::Tile1x128)  // x^T's next row is its own tile
      EXPECT_NE(both.columnwise.scale_inv_at(18, 129), 1.0f) << what;
  }
}

TEST(Fp8Quantize, AnEmptyMatrixGivesEmptyLayouts) {
  const Tensor x = Tensor::empty({0, 5}, DType::F32, MemCategory::Other, "empty");
  for (Fp8Granularity g : {Fp8Granularity::Tensor, Fp8Granularity::Tile1x128, Fp8Granularity::Block128x128, Fp8Granularity::Mx1x32}) {
    const Fp8Layouts both = fp8_quantize_both(fp8_source(x), {.granularity = g}, "x", "xt");
    EXPECT_EQ(both.rowwise.data.numel(), 0);
    EXPECT_EQ(both.columnwise.data.numel(), 0);
    EXPECT_EQ(both.rowwise.amax, 0.0f);
  }
}

TEST(Fp8Quantize, DataIsOneBytePerElement) {
  const Tensor x = fixture_matrix(130, 300);
  Fp8QuantizeOptions o;
  o.granularity = Fp8Granularity::Tile1x128;
  const Fp8Matrix q = fp8_quantize(x, o);
  EXPECT_EQ(q.data.dtype(), DType::F8E4M3);
  EXPECT_EQ(q.data.nbytes(), 130u * 300u);
  EXPECT_EQ(q.data.category(), MemCategory::Activations);
  EXPECT_EQ(q.scale_inv.numel(), 130 * 3);
}

}  // namespace
}  // namespace megaton::kernels
