// FP8 GEMM (kernels/fp8_gemm.h): equal, to fp32 rounding, to the exact sum over K groups of
// (codes' values products) x (group scales) computed in double; within TransformerEngine's FP8
// tolerance of the fp32 product of the unquantised inputs; every granularity pairing, mixed formats,
// ragged K, bf16 output and accumulation; bad pairings are refused.
#include "megaton/kernels/fp8_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "../support/fp8_reference.h"
#include "megaton/kernels/cpu/gemm.h"

namespace megaton::kernels {
namespace {

using test::fp8_reference_at;
using test::fp8_test_matrix;

struct Case {
  const char* name;
  Fp8Granularity ga, gb;
  fp8::Format fa, fb;
  int64_t group;  // the K group width the kernel uses for these granularities
};

class Fp8GemmTest : public ::testing::TestWithParam<Case> {};

TEST_P(Fp8GemmTest, MatchesTheScaledSumAndTheFp32Product) {
  const Case& c = GetParam();
  const int64_t M = 37, N = 150, K = 300;  // K not a multiple of 128 or 32: ragged last group
  const Tensor x = fp8_test_matrix(M, K, 1, 3.0f), w = fp8_test_matrix(N, K, 2, 2.0f);
  const Fp8Matrix a = fp8_quantize(x, {.format = c.fa, .granularity = c.ga});
  const Fp8Matrix b = fp8_quantize(w, {.format = c.fb, .granularity = c.gb});
  Tensor out = Tensor::empty({M, N}, DType::F32);
  fp8_gemm(ExecContext::on(out), out, a, b);
  const Tensor fx = fp8_dequantize(a), fw = fp8_dequantize(b);
  double worst_exact = 0, worst_fp32 = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const float got = out.data<float>()[m * N + n];
      ASSERT_TRUE(std::isfinite(got));
      const int64_t group = c.group == 0 ? K : c.group;
      const double exact = fp8_reference_at(a, b, m, n, group);
      double magnitude = 0, fp32 = 0;  // sum |a||b| bounds the rounding of an fp32 sum
      for (int64_t k = 0; k < K; ++k) {
        magnitude += std::fabs(static_cast<double>(fx.data<float>()[m * K + k]) * fw.data<float>()[n * K + k]);
        fp32 += static_cast<double>(x.data<float>()[m * K + k]) * w.data<float>()[n * K + k];
      }
      worst_exact = std::max(worst_exact, std::fabs(got - exact) / (magnitude + 1e-30));
      // TE's FP8 tolerance against the unquantised product, relative to the row's magnitude.
      worst_fp32 = std::max(worst_fp32, std::fabs(got - fp32) / (0.0675 + 0.125 * magnitude));
    }
  EXPECT_LT(worst_exact, 1e-5) << c.name;
  EXPECT_LT(worst_fp32, 1.0) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    Pairings, Fp8GemmTest,
    ::testing::Values(
        Case{"tensor_e4m3", Fp8Granularity::Tensor, Fp8Granularity::Tensor, fp8::Format::E4M3, fp8::Format::E4M3, 0},
        Case{"hybrid_e5m2_x_e4m3", Fp8Granularity::Tensor, Fp8Granularity::Tensor, fp8::Format::E5M2, fp8::Format::E4M3, 0},
        Case{"deepseek_1x128_x_128x128", Fp8Granularity::Tile1x128, Fp8Granularity::Block128x128, fp8::Format::E4M3,
             fp8::Format::E4M3, 128},
        Case{"wgrad_1x128_x_1x128", Fp8Granularity::Tile1x128, Fp8Granularity::Tile1x128, fp8::Format::E4M3,
             fp8::Format::E4M3, 128},
        Case{"tile_x_tensor", Fp8Granularity::Tile1x128, Fp8Granularity::Tensor, fp8::Format::E4M3, fp8::Format::E4M3, 128},
        Case{"mxfp8", Fp8Granularity::Mx1x32, Fp8Granularity::Mx1x32, fp8::Format::E4M3, fp8::Format::E4M3, 32}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(Fp8Gemm, SameResultOnEitherGemmLibraryPath) {
  // oneDNN bf16 panels where the CPU has native bf16, f32 panels on OpenBLAS elsewhere: the widened
  // values are exact either way, so only the summation order may differ.
  const Tensor x = fp8_test_matrix(20, 256, 3, 1.0f), w = fp8_test_matrix(24, 256, 4, 1.0f);
  const Fp8Matrix a = fp8_quantize(x, {.granularity = Fp8Granularity::Tile1x128});
  const Fp8Matrix b = fp8_quantize(w, {.granularity = Fp8Granularity::Block128x128});
  Tensor first = Tensor::empty({20, 24}, DType::F32), second = Tensor::empty({20, 24}, DType::F32);
  cpu::force_gemm_library(cpu::GemmLibrary::OpenBlas);
  fp8_gemm(ExecContext::on(first), first, a, b);
  cpu::force_gemm_library(std::nullopt);
  fp8_gemm(ExecContext::on(second), second, a, b);
  for (int64_t i = 0; i < first.numel(); ++i)
    EXPECT_NEAR(first.data<float>()[i], second.data<float>()[i], 1e-5 * (1 + std::fabs(first.data<float>()[i])));
}

TEST(Fp8Gemm, Bf16OutputAndAccumulation) {
  const Tensor x = fp8_test_matrix(8, 64, 5, 1.0f), w = fp8_test_matrix(16, 64, 6, 1.0f);
  const Fp8Matrix a = fp8_quantize(x, {}), b = fp8_quantize(w, {});
  Tensor f32 = Tensor::empty({8, 16}, DType::F32), bf16 = Tensor::empty({8, 16}, DType::BF16);
  fp8_gemm(ExecContext::on(f32), f32, a, b);
  fp8_gemm(ExecContext::on(bf16), bf16, a, b);
  Tensor twice = f32.clone(MemCategory::Other);
  fp8_gemm(ExecContext::on(twice), twice, a, b, /*accumulate=*/true);
  for (int64_t i = 0; i < f32.numel(); ++i) {
    const float v = f32.data<float>()[i];
    EXPECT_EQ(bf16_to_float(bf16.data<BFloat16>()[i].bits), bf16_to_float(float_to_bf16(v)));
    EXPECT_FLOAT_EQ(twice.data<float>()[i], 2 * v);
  }
  EXPECT_THROW(fp8_gemm(ExecContext::on(bf16), bf16, a, b, /*accumulate=*/true), std::exception);
  // A bias row is added to every row in fp32.
  Tensor bias = Tensor::empty({16}, DType::F32), biased = Tensor::empty({8, 16}, DType::F32);
  for (int64_t n = 0; n < 16; ++n) bias.data<float>()[n] = 0.5f * static_cast<float>(n) - 3.0f;
  fp8_gemm(ExecContext::on(biased), biased, a, b, false, bias);
  for (int64_t i = 0; i < f32.numel(); ++i) EXPECT_FLOAT_EQ(biased.data<float>()[i], f32.data<float>()[i] + bias.data<float>()[i % 16]);
}

TEST(Fp8Gemm, StripesForAnEpilogueGiveTheSameProductBitForBit) {
  // rows_done: the GEMM runs kFp8GemmStripeRows rows at a time (on oneDNN) and hands them over
  // kFp8StripeRows at a time, each once it is final (bias added, rounded to bf16); the values are
  // those of the one-piece GEMM. 700 rows: two GEMM stripes, the second ragged.
  static_assert(kFp8GemmStripeRows == 512 && kFp8StripeRows == 128);
  const int64_t M = 700, N = 150, K = 300;
  const Tensor x = fp8_test_matrix(M, K, 11, 2.0f), w = fp8_test_matrix(N, K, 12, 1.0f);
  Tensor bias = Tensor::empty({N}, DType::F32);
  for (int64_t n = 0; n < N; ++n) bias.data<float>()[n] = 0.25f * static_cast<float>(n % 7) - 0.5f;
  for (const auto& [ga, gb] : {std::pair{Fp8Granularity::Tensor, Fp8Granularity::Tensor},
                               std::pair{Fp8Granularity::Tile1x128, Fp8Granularity::Block128x128},
                               std::pair{Fp8Granularity::Mx1x32, Fp8Granularity::Mx1x32}})
    for (const DType dt : {DType::F32, DType::BF16})
      for (const auto lib :
           {std::optional<cpu::GemmLibrary>(cpu::GemmLibrary::OpenBlas), std::optional<cpu::GemmLibrary>()}) {
        cpu::force_gemm_library(lib);
        const std::string what =
            std::string(granularity_name(ga)) + " " + std::string(dtype_name(dt)) + (lib ? " openblas" : " default");
        const Fp8Matrix a = fp8_quantize(x, {.granularity = ga}), b = fp8_quantize(w, {.granularity = gb});
        Tensor whole = Tensor::empty({M, N}, dt), striped = Tensor::empty({M, N}, dt);
        fp8_gemm(ExecContext::on(whole), whole, a, b, false, bias);
        std::vector<std::pair<int64_t, int64_t>> handed;
        const size_t row_bytes = static_cast<size_t>(N) * dtype_size(dt);
        fp8_gemm(ExecContext::on(striped), striped, a, b, false, bias, [&](int64_t r0, int64_t r1) {
          handed.emplace_back(r0, r1);
          for (int64_t r = r0; r < r1; ++r)  // final when handed over
            ASSERT_EQ(std::memcmp(static_cast<const char*>(striped.raw()) + r * row_bytes,
                                  static_cast<const char*>(whole.raw()) + r * row_bytes, row_bytes),
                      0)
                << what << " row " << r;
        });
        cpu::force_gemm_library(std::nullopt);
        EXPECT_EQ(handed, (std::vector<std::pair<int64_t, int64_t>>{
                              {0, 128}, {128, 256}, {256, 384}, {384, 512}, {512, 640}, {640, 700}}))
            << what;
      }
}

TEST(Fp8Gemm, RefusesMismatchedOperands) {
  const Tensor x = fp8_test_matrix(4, 64, 7, 1.0f), w = fp8_test_matrix(8, 32, 8, 1.0f), v = fp8_test_matrix(8, 64, 9, 1.0f);
  const Fp8Matrix a = fp8_quantize(x, {}), b = fp8_quantize(w, {});
  Tensor out = Tensor::empty({4, 8}, DType::F32);
  EXPECT_THROW(fp8_gemm(ExecContext::on(out), out, a, b), std::exception);  // K differs
  const Fp8Matrix mx = fp8_quantize(v, {.granularity = Fp8Granularity::Mx1x32});
  EXPECT_THROW(fp8_gemm(ExecContext::on(out), out, a, mx), std::exception);  // MX with per-tensor
  Tensor wrong = Tensor::empty({4, 9}, DType::F32);
  EXPECT_THROW(fp8_gemm(ExecContext::on(wrong), wrong, a, fp8_quantize(v, {})), std::exception);
}

}  // namespace
}  // namespace megaton::kernels
