// TransformerEngine's fused FP8 layers at model level (nn/fusion.h): LayerNormLinear /
// RMSNormLinear (the norm's output quantised straight from its statistics) and LayerNormMLP's
// activation cast (fc2's FP8 input straight from fc1's output). In f32 the producers compute the
// values the unfused ops write, so loss and every gradient are bitwise the unfused model's, under
// every recipe and each fusion alone; the compute-dtype tensors they skip show in the allocator's
// count of bytes allocated: exactly two norm outputs and one activation output per layer fewer. In
// bf16 they skip one rounding (to bf16 before the quantiser) and stay within FP8's tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "../support/tiny_model.h"
#include "megaton/core/allocator.h"
#include "megaton/models/transformer_model.h"

using namespace megaton;

namespace {

struct Outcome {
  double loss;
  std::vector<std::vector<double>> grads;
  size_t activation_bytes;  // allocated by the measured forward and backward
};

// 576 rows: fc1's FP8 GEMM runs in two calls (kernels::kFp8GemmStripeRows, the second ragged) and
// hands its output to the LayerNormMLP epilogue in five stripes, the last ragged.
constexpr int64_t kB = 9, kT = 64;

Outcome run(const std::string& preset, fp8::Recipe recipe, const nn::FusionConfig& fusion, DType dtype) {
  models::TransformerConfig c = megaton::testing::tiny_config(preset);
  c.add_bias_linear = true;  // fc1's bias goes through the activation producer too
  models::TransformerModel m(c);
  m.init_weights(11);
  megaton::testing::give_biases_and_norms_values(m.parameters());
  m.set_compute_dtype(dtype);
  m.set_fusion(fusion);
  fp8::Fp8Config config;
  config.recipe = recipe;
  m.enable_fp8(config);
  auto step = [&] {
    m.refresh_compute_weights();
    nn::zero_grads(m.parameters());
    auto [in, tg] = megaton::testing::tiny_batch(kB, kT);
    models::ModelCtx ctx;
    const double loss = m.forward(ctx, in, tg, true).loss;
    m.backward_input(ctx);
    m.backward_weight(ctx);
    return loss;
  };
  if (recipe == fp8::Recipe::Delayed) {  // one calibrating step: its linears run unquantised
    step();
    for (fp8::LinearQuantizer* q : m.fp8_quantizers()) q->next_step();
  }
  Allocator::host().reset_peaks();
  const double loss = step();
  const size_t bytes = Allocator::host().stats().allocated[static_cast<size_t>(MemCategory::Activations)];
  return {loss, megaton::testing::gradients_of(m.parameters()), bytes};
}

bool bitwise_equal(const Outcome& a, const Outcome& b) {
  return megaton::testing::bitwise_equal(a.loss, a.grads, b.loss, b.grads);
}

constexpr nn::FusionConfig kUnfused{.layernorm_linear = false, .layernorm_mlp = false};
constexpr nn::FusionConfig kNormLinear{.layernorm_linear = true, .layernorm_mlp = false};
constexpr nn::FusionConfig kMlpCast{.layernorm_linear = false, .layernorm_mlp = true};
constexpr nn::FusionConfig kFused{.layernorm_linear = true, .layernorm_mlp = true};

const fp8::Recipe kRecipes[] = {fp8::Recipe::Delayed, fp8::Recipe::Tensorwise, fp8::Recipe::Blockwise,
                                fp8::Recipe::Mxfp8};

}  // namespace

TEST(Fp8Fusion, FusedLayersGiveTheUnfusedLossAndGradientsBitwiseInF32AndWriteLess) {
  for (const std::string preset : {"gpt-tiny", "llama-tiny"})
    for (const fp8::Recipe recipe : kRecipes) {
      SCOPED_TRACE(preset + " " + std::string(fp8::recipe_name(recipe)));
      const models::TransformerConfig c = megaton::testing::tiny_config(preset);
      const Outcome unfused = run(preset, recipe, kUnfused, DType::F32);
      ASSERT_TRUE(std::isfinite(unfused.loss));
      const size_t rows = kB * kT, f32 = 4;
      const size_t norm_out = rows * static_cast<size_t>(c.hidden_size) * f32;
      const size_t act_out = rows * static_cast<size_t>(c.ffn_hidden_size) * f32;
      const size_t layers = static_cast<size_t>(c.num_layers);
      struct Form {
        nn::FusionConfig fusion;
        size_t skipped;  // compute-dtype bytes the form never writes
      };
      for (const Form& f : {Form{kNormLinear, layers * 2 * norm_out}, Form{kMlpCast, layers * act_out},
                            Form{kFused, layers * (2 * norm_out + act_out)}}) {
        SCOPED_TRACE(std::string("norm-linear ") + (f.fusion.layernorm_linear ? "on" : "off") + ", mlp-cast " +
                     (f.fusion.layernorm_mlp ? "on" : "off"));
        const Outcome fused = run(preset, recipe, f.fusion, DType::F32);
        EXPECT_TRUE(bitwise_equal(fused, unfused)) << fused.loss << " vs " << unfused.loss;
        EXPECT_EQ(fused.activation_bytes + f.skipped, unfused.activation_bytes);
      }
    }
}

TEST(Fp8Fusion, Bf16FusedLayersStayWithinFp8ToleranceOfTheUnfusedOnes) {
  for (const std::string preset : {"gpt-tiny", "llama-tiny"})
    for (const fp8::Recipe recipe : kRecipes) {
      SCOPED_TRACE(preset + " " + std::string(fp8::recipe_name(recipe)));
      const Outcome unfused = run(preset, recipe, kUnfused, DType::BF16);
      const Outcome fused = run(preset, recipe, kFused, DType::BF16);
      ASSERT_TRUE(std::isfinite(fused.loss));
      EXPECT_NEAR(fused.loss, unfused.loss, 1e-2 * unfused.loss);
      // TransformerEngine's FP8 tolerances (rtol 0.125) on each whole gradient.
      for (size_t i = 0; i < unfused.grads.size(); ++i)
        EXPECT_LT(megaton::testing::relative_error(fused.grads[i], unfused.grads[i]), 0.125) << "parameter " << i;
    }
}

// Without FP8 the fusions change nothing: the norms already write the GEMMs' dtype.
TEST(Fp8Fusion, WithoutFp8TheFusionsChangeNothing) {
  for (const DType dtype : {DType::F32, DType::BF16}) {
    models::TransformerModel a(megaton::testing::tiny_config("llama-tiny")), b(megaton::testing::tiny_config("llama-tiny"));
    std::vector<Outcome> out;
    for (auto* m : {&a, &b}) {
      m->init_weights(3);
      m->set_compute_dtype(dtype);
      m->set_fusion(m == &a ? kUnfused : kFused);
      m->refresh_compute_weights();
      auto [in, tg] = megaton::testing::tiny_batch(kB, kT);
      models::ModelCtx ctx;
      Allocator::host().reset_peaks();
      const double loss = m->forward(ctx, in, tg, true).loss;
      m->backward(ctx);
      out.push_back({loss, megaton::testing::gradients_of(m->parameters()),
                     Allocator::host().stats().allocated[static_cast<size_t>(MemCategory::Activations)]});
    }
    EXPECT_TRUE(bitwise_equal(out[0], out[1]));
    EXPECT_EQ(out[0].activation_bytes, out[1].activation_bytes);
  }
}
