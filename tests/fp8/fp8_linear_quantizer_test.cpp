// A linear layer's three GEMMs on the operands fp8::LinearQuantizer makes, for every recipe and
// format: within FP8's rounding (half an ulp: 2^-4 for E4M3, 2^-3 for E5M2) of the fp32 GEMMs in norm;
// the weight's layouts are cached for the step; delayed scaling moves to the observed amax.
#include "../support/host_tensors.h"
#include "megaton/fp8/linear_quantizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "megaton/kernels/fp8_gemm.h"
#include "megaton/kernels/reduce.h"

using megaton::testing::transposed;

namespace megaton::fp8 {
namespace {

Tensor random_matrix(int64_t rows, int64_t cols, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  Tensor t = Tensor::empty({rows, cols}, DType::F32, MemCategory::Other, "m");
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(gen);
  return t;
}

// ||got - a . b^T||_F / ||a . b^T||_F: each FP8 element is within half a unit in the last place of
// its value (2^-4 relative for E4M3, 2^-3 for E5M2), so the product's relative error in norm stays
// below that bound (random rounding errors partly cancel in the sums).
double relative_error(const Tensor& got, const Tensor& a, const Tensor& b) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(0);
  double err = 0, norm = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double want = 0;
      for (int64_t k = 0; k < K; ++k) want += static_cast<double>(a.data<float>()[m * K + k]) * b.data<float>()[n * K + k];
      const double g = got.data<float>()[m * N + n];
      if (!std::isfinite(g)) return INFINITY;
      err += (g - want) * (g - want);
      norm += want * want;
    }
  return std::sqrt(err / norm);
}

struct Case {
  const char* name;
  Recipe recipe;
  bool hybrid;
};

class LinearQuantizerTest : public ::testing::TestWithParam<Case> {};

TEST_P(LinearQuantizerTest, ThreeGemmsMatchFp32) {
  Fp8Config config;
  config.recipe = GetParam().recipe;
  config.hybrid = GetParam().hybrid;
  LinearQuantizer q("layer", config);
  const int64_t M = 160, K = 192, N = 136;
  const Tensor x = random_matrix(M, K, 1, 1.0f), w = random_matrix(N, K, 2, 0.05f), dy = random_matrix(M, N, 3, 1e-3f);
  const kernels::ExecContext cpu{};
  // Two steps: delayed scaling calibrates in the first (no scales yet: the GEMMs would run
  // unquantised, reporting their operands) and then uses that step's amaxes.
  for (int step = 0; step < 2; ++step) {
    if (config.recipe == Recipe::Delayed && step == 0) {
      EXPECT_TRUE(q.calibrating());
      EXPECT_THROW(q.input(x), std::exception);  // no scale to quantise with
      q.observe_input(x);
      q.observe_weight(w);
      q.observe_grad_output(dy);
      q.next_step();
      continue;
    }
    EXPECT_FALSE(q.calibrating()) << GetParam().name;
    const LinearQuantizer::Input in = q.input(x);
    Tensor y = Tensor::empty({M, N}, DType::F32), dx = Tensor::empty({M, K}, DType::F32), dw = Tensor::empty({N, K}, DType::F32);
    kernels::fp8_gemm(cpu, y, in.fprop, q.weight(w, step));
    kernels::fp8_gemm(cpu, dx, q.grad_output(dy), q.weight_transposed(w, step));
    kernels::fp8_gemm(cpu, dw, q.grad_output_transposed(dy), in.wgrad);
    const double e4m3 = 0.0625, grads = config.hybrid ? 0.125 : e4m3;
    EXPECT_LT(relative_error(y, x, w), e4m3) << GetParam().name << " fprop, step " << step;
    EXPECT_LT(relative_error(dx, dy, transposed(w)), grads) << GetParam().name << " dgrad, step " << step;
    EXPECT_LT(relative_error(dw, transposed(dy), transposed(x)), grads) << GetParam().name << " wgrad, step " << step;
    q.next_step();
  }
  // The weight's layouts are made once per weight version: a changed weight is seen with a new one.
  Tensor w2 = w.clone(MemCategory::Other);
  for (int64_t i = 0; i < w2.numel(); ++i) w2.data<float>()[i] *= 0.5f;
  const float first = w.data<float>()[0];
  q.weight(w, 10);
  q.weight_transposed(w, 10);
  EXPECT_NEAR(kernels::fp8_dequantize(q.weight(w2, 10)).data<float>()[0], first, std::fabs(first) * 0.07);
  EXPECT_NEAR(kernels::fp8_dequantize(q.weight_transposed(w2, 10)).data<float>()[0], first, std::fabs(first) * 0.07);
  EXPECT_NEAR(kernels::fp8_dequantize(q.weight(w2, 11)).data<float>()[0], first / 2, std::fabs(first) * 0.035);
  EXPECT_NEAR(kernels::fp8_dequantize(q.weight_transposed(w2, 11)).data<float>()[0], first / 2, std::fabs(first) * 0.035);
  EXPECT_EQ(q.grad_output(dy).format(), config.gradient_format());
  EXPECT_EQ(q.grad_output_transposed(dy).format(), config.gradient_format());
  EXPECT_EQ(q.input(x).wgrad.format(), config.forward_format());
  if (config.recipe == Recipe::Delayed) {
    const auto states = q.delayed_states();
    ASSERT_EQ(states.size(), 3u);
    EXPECT_EQ(states[0]->scale(), 448.0f / kernels::abs_max(cpu, x));  // from the calibrated amax
    EXPECT_EQ(states[2]->format(), config.gradient_format());
  } else {
    EXPECT_TRUE(q.delayed_states().empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, LinearQuantizerTest,
                         ::testing::Values(Case{"delayed_hybrid", Recipe::Delayed, true},
                                           Case{"delayed_e4m3", Recipe::Delayed, false},
                                           Case{"tensorwise_hybrid", Recipe::Tensorwise, true},
                                           Case{"blockwise", Recipe::Blockwise, false},
                                           Case{"mxfp8", Recipe::Mxfp8, false}),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(Fp8Recipe, NamesAndGranularities) {
  EXPECT_EQ(recipe_from_name("blockwise"), Recipe::Blockwise);
  EXPECT_THROW(recipe_from_name("fp8"), std::exception);
  EXPECT_TRUE(hybrid_from_format_name("hybrid"));
  EXPECT_THROW(hybrid_from_format_name("e5m2"), std::exception);
  Fp8Config c;
  c.recipe = Recipe::Blockwise;
  EXPECT_EQ(c.activation_granularity(), kernels::Fp8Granularity::Tile1x128);
  EXPECT_EQ(c.weight_granularity(), kernels::Fp8Granularity::Block128x128);
  c.hybrid = true;
  EXPECT_EQ(c.gradient_format(), Format::E5M2);
}

}  // namespace
}  // namespace megaton::fp8
