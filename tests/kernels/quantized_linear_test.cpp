// 8-bit inference weights (kernels/quantized_linear.h, cpu/gemv_quantized.h): the quantisers' error
// bounds, every E4M3 code widened exactly on both GEMV paths, the GEMV and the prefill GEMM against
// a double reference over the dequantised weight, thread-count independence, and errors.
#include "megaton/kernels/quantized_linear.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "finite_diff.h"
#include "megaton/core/fp8_format.h"
#include "megaton/kernels/cpu/gemv_quantized.h"
#include "megaton/kernels/decode_rows.h"
#include "megaton/kernels/fp8_quantize.h"

using namespace megaton;
using namespace megaton::kernels;

namespace {

Tensor from(const std::vector<float>& v, Shape shape, const std::string& name = "t") {
  Tensor t = Tensor::empty(std::move(shape), DType::F32, MemCategory::Other, name);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

std::vector<cpu::GemvPath> paths() {
  std::vector<cpu::GemvPath> p = {cpu::GemvPath::Portable};
  if (cpu::gemv_simd_compiled()) p.push_back(cpu::GemvPath::Simd);
  return p;
}

const char* path_name(cpu::GemvPath p) { return p == cpu::GemvPath::Simd ? "simd" : "portable"; }

cpu::QuantizedRows rows_of(const QuantizedWeight& q) {
  return {q.codes.raw(), q.codes.dtype(), q.scale_inv.data<float>(), q.block_rows, q.block_cols};
}

// y = dequant(W) x + bias in double, with sum |w x| for the fp32-accumulation bound.
void reference(const Tensor& wd, const float* x, const float* bias, int64_t r, double& want, double& mag) {
  const int64_t in = wd.size(1);
  want = bias ? bias[r] : 0.0;
  mag = std::abs(want);
  for (int64_t c = 0; c < in; ++c) {
    const double p = double(wd.data<float>()[r * in + c]) * x[c];
    want += p;
    mag += std::abs(p);
  }
}

// Shapes with ragged 128 x 128 blocks, K below and not a multiple of the 8 / 32-wide steps, and
// one large enough for several threads.
const std::vector<std::pair<int64_t, int64_t>> kShapes = {{1, 1}, {7, 3}, {33, 17}, {200, 300}, {257, 129}, {640, 384}};

}  // namespace

// int8: codes within +-127, each row's largest |w| coded as 127 exactly, every element within half
// a step of its weight (planted: scale_inv amax / 128, and rounding by truncation: both caught by
// the half-step bound).
TEST(QuantizeWeight, Int8RowsAreSymmetricWithinHalfAStep) {
  const int64_t out = 9, in = 70;
  auto v = fd::random_vector<float>(out * in, 1, -3.0, 3.0);
  for (int64_t c = 0; c < in; ++c) v[4 * in + c] = 0;  // an all-zero row codes as zeros
  const QuantizedWeight q = quantize_weight(from(v, {out, in}, "w"), WeightQuant::Int8Row);
  ASSERT_EQ(q.codes.dtype(), DType::I8);
  ASSERT_EQ(q.scale_inv.shape(), (Shape{out, 1}));
  const Tensor d = dequantize_weight(q);
  for (int64_t r = 0; r < out; ++r) {
    int max_code = 0;
    const float step = q.scale_inv.data<float>()[r];
    for (int64_t c = 0; c < in; ++c) {
      const int code = q.codes.data<int8_t>()[r * in + c];
      max_code = std::max(max_code, std::abs(code));
      EXPECT_LE(std::abs(d.data<float>()[r * in + c] - v[r * in + c]), 0.5f * step * (1 + 1e-6f)) << r << "," << c;
    }
    EXPECT_EQ(max_code, r == 4 ? 0 : 127) << r;
  }
}

// fp8-block is kernels::fp8_quantize's Block128x128 E4M3, bit for bit (the format DeepSeek-V3's
// weight_scale_inv describes), on a shape with ragged blocks.
TEST(QuantizeWeight, Fp8BlockIsTheBlockwiseE4M3Quantiser) {
  const auto v = fd::random_vector<float>(200 * 300, 2, -5.0, 5.0);
  const Tensor w = from(v, {200, 300}, "w");
  const QuantizedWeight q = quantize_weight(w, WeightQuant::Fp8Block);
  Fp8QuantizeOptions o;
  o.granularity = Fp8Granularity::Block128x128;
  const Fp8Matrix m = fp8_quantize(w, o);
  ASSERT_EQ(q.codes.dtype(), DType::F8E4M3);
  ASSERT_EQ(q.scale_inv.shape(), (Shape{2, 3}));
  EXPECT_EQ(std::memcmp(q.codes.raw(), m.data.raw(), q.codes.nbytes()), 0);
  EXPECT_EQ(std::memcmp(q.scale_inv.raw(), m.scale_inv.raw(), q.scale_inv.nbytes()), 0);
  const Tensor d = dequantize_weight(q), e = fp8_dequantize(m);
  EXPECT_EQ(std::memcmp(d.raw(), e.raw(), d.nbytes()), 0);
}

// A bf16 weight (a served model's tied head held in bf16) is quantised 128 rows at a time, never
// widened whole: the same codes and scales as its widened f32 copy, on rows that end in a ragged slab
// (planted: a slab's scales written at its row instead of its block row; caught by fp8-block).
TEST(QuantizeWeight, Bf16WeightsQuantiseAsTheirF32Values) {
  const int64_t out = 300, in = 260;
  const Tensor w = from(fd::random_vector<float>(out * in, 3, -4.0, 4.0), {out, in}, "w").to(DType::BF16);
  for (const WeightQuant kind : {WeightQuant::Int8Row, WeightQuant::Fp8Block}) {
    const QuantizedWeight a = quantize_weight(w, kind), b = quantize_weight(w.to(DType::F32), kind);
    ASSERT_EQ(a.codes.shape(), b.codes.shape());
    ASSERT_EQ(a.codes.dtype(), b.codes.dtype());
    ASSERT_EQ(a.scale_inv.shape(), b.scale_inv.shape());
    EXPECT_EQ(std::memcmp(a.codes.raw(), b.codes.raw(), a.codes.nbytes()), 0) << weight_quant_name(kind);
    EXPECT_EQ(std::memcmp(a.scale_inv.raw(), b.scale_inv.raw(), a.scale_inv.nbytes()), 0) << weight_quant_name(kind);
    EXPECT_EQ(std::make_tuple(a.block_rows, a.block_cols), std::make_tuple(b.block_rows, b.block_cols));
  }
}

// Every finite E4M3 code (normals, subnormals, zeros, both signs) read by the GEMV equals its exact
// value on each path: the SIMD path's fp16 reinterpretation (planted: the x256 left out, or the sign
// shifted one bit short: each caught). One column per code, x one-hot.
TEST(QuantizedGemv, EveryFiniteE4M3CodeIsWidenedExactly) {
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7f) != 0x7f) codes.push_back(static_cast<uint8_t>(c));
  const int64_t in = static_cast<int64_t>(codes.size());
  const float scale = 1.0f;
  const cpu::QuantizedRows w{codes.data(), DType::F8E4M3, &scale, 1, in};
  for (cpu::GemvPath p : paths()) {
    for (int64_t k = 0; k < in; ++k) {
      std::vector<float> x(static_cast<size_t>(in), 0.0f), y(1);
      x[static_cast<size_t>(k)] = 1.0f;
      cpu::gemv_quantized(y.data(), x.data(), w, static_cast<const float*>(nullptr), 1, in, 1, p);
      ASSERT_EQ(y[0], fp8::decode(codes[static_cast<size_t>(k)], fp8::Format::E4M3))
          << path_name(p) << " code " << int(codes[static_cast<size_t>(k)]);
    }
  }
}

// The GEMV on both paths, f32 and bf16 activations, with and without bias, against the double
// reference over the dequantised weight (the bound: fp32 accumulation over sum |w x|, plus bf16's
// final rounding). Planted: x scaled by the first row band's block scales only (caught on 200 x 300).
TEST(QuantizedGemv, MatchesTheDoubleReferenceOnOddShapes) {
  for (WeightQuant kind : {WeightQuant::Int8Row, WeightQuant::Fp8Block}) {
    for (auto [in, out] : kShapes) {
      const Tensor w = from(fd::random_vector<float>(in * out, 3), {out, in}, "w");
      const QuantizedWeight q = quantize_weight(w, kind);
      const Tensor wd = dequantize_weight(q);
      const auto x = fd::random_vector<float>(in, 4), bias = fd::random_vector<float>(out, 5);
      std::vector<BFloat16> xb;
      for (float v : x) xb.push_back(BFloat16{float_to_bf16(v)});
      std::vector<float> xbf;
      for (BFloat16 v : xb) xbf.push_back(bf16_to_float(v.bits));
      for (cpu::GemvPath p : paths()) {
        SCOPED_TRACE(std::string(weight_quant_name(kind)) + " " + path_name(p) + " in " + std::to_string(in) +
                     " out " + std::to_string(out));
        std::vector<float> y(out);
        std::vector<BFloat16> yb(out);
        cpu::gemv_quantized(y.data(), x.data(), rows_of(q), bias.data(), 1, in, out, p);
        cpu::gemv_quantized(yb.data(), xb.data(), rows_of(q), static_cast<const float*>(nullptr), 1, in, out, p);
        for (int64_t r = 0; r < out; ++r) {
          double want, mag;
          reference(wd, x.data(), bias.data(), r, want, mag);
          ASSERT_TRUE(std::isfinite(y[r]));
          ASSERT_NEAR(y[r], want, 1e-6 * mag + 1e-30) << "row " << r;
          reference(wd, xbf.data(), nullptr, r, want, mag);
          ASSERT_NEAR(bf16_to_float(yb[r].bits), want, 1e-6 * mag + std::abs(want) / 256) << "bf16 row " << r;
        }
      }
    }
  }
}

// Blocks of any size, odd ones included (3 x 5 here, ragged at both edges): decode takes weight rows
// two at a time, and a pair that straddles two row bands must not share one band's scaled x
// (planted: pairs formed across bands, caught).
TEST(QuantizedGemv, OddBlocksStraddlingAPairOfRowsMatchTheReference) {
  const int64_t in = 37, out = 11, br = 3, bc = 5, sc = (in + bc - 1) / bc;
  const auto wf = fd::random_vector<float>(in * out, 13), sf = fd::random_vector<float>(sc * ((out + br - 1) / br), 14);
  std::vector<int8_t> codes;
  for (float v : wf) codes.push_back(static_cast<int8_t>(std::lround(v * 127)));
  std::vector<float> scales;
  for (float v : sf) scales.push_back(0.01f + std::abs(v));
  const auto x = fd::random_vector<float>(in, 15);
  for (cpu::GemvPath p : paths()) {
    std::vector<float> y(out);
    cpu::gemv_quantized(y.data(), x.data(), {codes.data(), DType::I8, scales.data(), br, bc},
                        static_cast<const float*>(nullptr), 1, in, out, p);
    for (int64_t r = 0; r < out; ++r) {
      double want = 0, mag = 0;
      for (int64_t c = 0; c < in; ++c) {
        const double v = double(codes[size_t(r * in + c)]) * scales[size_t((r / br) * sc + c / bc)] * x[size_t(c)];
        want += v;
        mag += std::abs(v);
      }
      ASSERT_NEAR(y[size_t(r)], want, 1e-6 * mag) << path_name(p) << " row " << r;
    }
  }
}

TEST(QuantizedGemv, BitwiseIndependentOfTheThreadCount) {
  const int64_t in = 640, out = 384;
  const QuantizedWeight q = quantize_weight(from(fd::random_vector<float>(in * out, 6), {out, in}), WeightQuant::Fp8Block);
  const auto x = fd::random_vector<float>(in, 7);
  std::vector<float> one(out), two(out);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  cpu::gemv_quantized(one.data(), x.data(), rows_of(q), static_cast<const float*>(nullptr), 1, in, out);
  omp_set_num_threads(2);
  cpu::gemv_quantized(two.data(), x.data(), rows_of(q), static_cast<const float*>(nullptr), 1, in, out);
  omp_set_num_threads(saved);
  EXPECT_EQ(std::memcmp(one.data(), two.data(), sizeof(float) * out), 0);
}

// More than kDecodeRows rows (prefill) run band-wise GEMMs over dequantised rows, split over the
// threads: equal to the reference and to the GEMV of each row, across many narrow bands (11 rows)
// and several wide ones with a ragged last (20 rows, out 640; planted: the band's bias offset left at
// 0, caught).
TEST(QuantizedLinear, PrefillBandsAgreeWithTheGemvAndTheReference) {
  const int64_t in = 96, out = 640;
  for (const int64_t N : {kDecodeRows + 3, int64_t{20}})
    for (WeightQuant kind : {WeightQuant::Int8Row, WeightQuant::Fp8Block}) {
      const QuantizedWeight q = quantize_weight(from(fd::random_vector<float>(in * out, 8), {out, in}), kind);
      const Tensor wd = dequantize_weight(q);
      const auto xv = fd::random_vector<float>(N * in, 9), bv = fd::random_vector<float>(out, 10);
      const Tensor x = from(xv, {N, in}, "x"), bias = from(bv, {out}, "b");
      Tensor y = Tensor::empty({N, out}, DType::F32, MemCategory::Other, "y");
      quantized_linear_forward(ExecContext{}, y, x, q, bias);
      for (int64_t i = 0; i < N; ++i) {
        Tensor yi = Tensor::empty({1, out}, DType::F32, MemCategory::Other, "yi");
        quantized_linear_forward(ExecContext{}, yi, x.slice_rows(i, i + 1), q, bias);
        for (int64_t r = 0; r < out; ++r) {
          double want, mag;
          reference(wd, xv.data() + i * in, bv.data(), r, want, mag);
          ASSERT_NEAR(y.data<float>()[i * out + r], want, 1e-6 * mag)
              << weight_quant_name(kind) << " " << i << "," << r;
          ASSERT_NEAR(yi.data<float>()[r], want, 1e-6 * mag) << weight_quant_name(kind) << " " << i << "," << r;
        }
      }
    }
}

// Up to kDecodeRows rows run the GEMV, each row with the bits of a one-row call, with per-row and
// 128 x 128 block scales (planted: the block-scaled x rows all taken from row 0, caught).
TEST(QuantizedLinear, AFewRowsAreTheOneRowGemvOfEach) {
  const int64_t in = 300, out = 260, N = kDecodeRows;
  for (WeightQuant kind : {WeightQuant::Int8Row, WeightQuant::Fp8Block}) {
    const QuantizedWeight q = quantize_weight(from(fd::random_vector<float>(in * out, 12), {out, in}), kind);
    const Tensor x = from(fd::random_vector<float>(N * in, 13), {N, in}, "x");
    const Tensor bias = from(fd::random_vector<float>(out, 14), {out}, "b");
    Tensor y = Tensor::empty({N, out}, DType::F32, MemCategory::Other, "y");
    Tensor yi = Tensor::empty({1, out}, DType::F32, MemCategory::Other, "yi");
    quantized_linear_forward(ExecContext{}, y, x, q, bias);
    for (int64_t i = 0; i < N; ++i) {
      quantized_linear_forward(ExecContext{}, yi, x.slice_rows(i, i + 1), q, bias);
      EXPECT_EQ(std::memcmp(yi.data<float>(), y.data<float>() + i * out, sizeof(float) * out), 0)
          << weight_quant_name(kind) << " row " << i;
    }
  }
}

// A weight with one scale row per output row (as hf_format.cpp assembles one) is given one per band
// where its rows share them: the widest power-of-two fraction of the asked band that fits, the same
// values and bitwise the same GEMV output; rows whose scales differ anywhere keep per-row scales.
TEST(QuantizedLinear, RowBandsKeepTheValuesAndTheGemvBits) {
  const int64_t in = 300, out = 260;
  const QuantizedWeight blocks =
      quantize_weight(from(fd::random_vector<float>(in * out, 16), {out, in}), WeightQuant::Fp8Block);
  // Per-row scales: 128-row blocks with rows swapped between the halves of each block stay 128-banded;
  // blocks cut in 64-row halves and interleaved (as fused q / k / v heads are) band at 64.
  const auto per_row = [&](auto source_row) {
    QuantizedWeight w = blocks;
    w.codes = Tensor::empty({out, in}, DType::F8E4M3, MemCategory::Other, "codes");
    w.scale_inv = Tensor::empty({out, blocks.scale_inv.size(1)}, DType::F32, MemCategory::Other, "s");
    w.block_rows = 1;
    const int64_t sc = w.scale_inv.size(1);
    for (int64_t r = 0; r < out; ++r) {
      const int64_t from_row = source_row(r);
      std::memcpy(static_cast<uint8_t*>(w.codes.raw()) + r * in,
                  static_cast<const uint8_t*>(blocks.codes.raw()) + from_row * in, in);
      std::memcpy(w.scale_inv.data<float>() + r * sc, blocks.scale_inv.data<float>() + (from_row / 128) * sc,
                  sizeof(float) * sc);
    }
    return w;
  };
  const auto same = [](int64_t r) { return r; };
  const auto halves = [](int64_t r) {  // 64-row halves of blocks 0 and 1 interleaved: 0a 1a 0b 1b
    if (r >= 256) return r;
    const int64_t half = r / 64;
    return (half % 2) * 128 + (half / 2) * 64 + r % 64;
  };
  const auto x = fd::random_vector<float>(in, 17);
  for (const auto& [w, band] : {std::pair{per_row(same), int64_t{128}}, std::pair{per_row(halves), int64_t{64}}}) {
    const QuantizedWeight banded = with_row_bands(w, 128);
    EXPECT_EQ(banded.block_rows, band);
    EXPECT_EQ(banded.scale_inv.size(0), (out + band - 1) / band);
    const Tensor a = dequantize_weight(banded), b = dequantize_weight(w);
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << band;
    std::vector<float> y(out), yb(out);
    cpu::gemv_quantized(y.data(), x.data(), rows_of(w), static_cast<const float*>(nullptr), 1, in, out);
    cpu::gemv_quantized(yb.data(), x.data(), rows_of(banded), static_cast<const float*>(nullptr), 1, in, out);
    EXPECT_EQ(std::memcmp(y.data(), yb.data(), sizeof(float) * out), 0) << band;
  }
  QuantizedWeight odd = per_row(same);
  odd.scale_inv.data<float>()[5 * odd.scale_inv.size(1) + 2] *= 2;  // one row's third block differs
  EXPECT_EQ(with_row_bands(odd, 128).block_rows, 1);
  EXPECT_EQ(with_row_bands(blocks, 64).block_rows, 128) << "a weight already banded is left as it is";
}

TEST(QuantizedLinear, ErrorsNameTheTensor) {
  auto v = fd::random_vector<float>(12, 11);
  v[5] = std::numeric_limits<float>::infinity();
  try {
    quantize_weight(from(v, {3, 4}, "blocks.0.fc1.weight"), WeightQuant::Int8Row);
    FAIL() << "a non-finite weight was quantised";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'blocks.0.fc1.weight' holds a non-finite value at element 5"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(weight_quant_from_name("int4"), Error);
  const QuantizedWeight q = quantize_weight(from(fd::random_vector<float>(12, 12), {3, 4}), WeightQuant::Int8Row);
  Tensor x = from(fd::random_vector<float>(5, 13), {1, 5}, "x"), y = Tensor::empty({1, 3}, DType::F32);
  EXPECT_THROW(quantized_linear_forward(ExecContext{}, y, x, q, Tensor()), Error);  // 5 features, expected 4
}
