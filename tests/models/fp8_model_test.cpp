// FP8 GEMMs at the model level: the same weights with every transformer linear in FP8 give the
// loss and every gradient close to f32 (FP8's precision: a few percent), every recipe; the FP8 path
// really runs (the inputs kept for backward-W are one byte per element); delayed scaling moves its
// scales once per step.
#include <gtest/gtest.h>

#include <cmath>

#include "../support/tiny_model.h"
#include "megaton/core/allocator.h"
#include "megaton/models/transformer_model.h"

using namespace megaton;

namespace {

struct Result {
  double loss;
  std::vector<std::vector<double>> grads;  // per parameter
};

Result run(models::TransformerModel& m) {
  nn::zero_grads(m.parameters());
  auto [in, tg] = megaton::testing::tiny_batch(2, 32);
  models::ModelCtx ctx;
  const double loss = m.forward(ctx, in, tg, true).loss;
  m.backward(ctx);
  return {loss, megaton::testing::gradients_of(m.parameters())};
}

using megaton::testing::relative_error;

// The tiny config; a mixture of experts routes every token to every expert, so that FP8's rounding
// cannot flip a top-k choice (a flipped choice is another model, not a rounding error).
models::TransformerConfig config_of(const std::string& preset) {
  models::TransformerConfig c = megaton::testing::tiny_config(preset);
  c.moe.moe_router_topk = c.moe.num_moe_experts;
  c.moe.moe_router_group_topk = c.moe.moe_router_num_groups;
  return c;
}

struct Case {
  const char* name;
  fp8::Recipe recipe;
  bool hybrid;
};

class Fp8Model : public ::testing::TestWithParam<Case> {};

TEST_P(Fp8Model, LossAndEveryGradientMatchF32ToFp8Accuracy) {
  // deepseek: MLA's five linears and the MoE layer's shared expert in FP8 (its routed experts' grouped
  // GEMMs have no FP8 path yet), an MTP depth in the compute dtype.
  for (const std::string preset : {"gpt-tiny", "llama-tiny", "deepseek-v3-tiny"}) {
    SCOPED_TRACE(preset);
    models::TransformerModel ref(config_of(preset)), m(config_of(preset));
    ref.init_weights(5);
    m.init_weights(5);
    // Biases start at zero; give them values so the FP8 path's bias is exercised.
    for (models::TransformerModel* model : {&ref, &m})
      for (nn::Parameter* p : model->parameters())
        if (p->name.ends_with(".bias"))
          for (int64_t i = 0; i < p->value.numel(); ++i) p->value.data<float>()[i] = 0.2f * std::sin(0.7f * static_cast<float>(i));
    fp8::Fp8Config config;
    config.recipe = GetParam().recipe;
    config.hybrid = GetParam().hybrid;
    m.enable_fp8(config);
    const size_t per_layer = preset == "deepseek-v3-tiny" ? 7 : 4;  // MLA 5 + 2 (dense MLP or shared expert)
    ASSERT_EQ(m.fp8_quantizers().size(), per_layer * static_cast<size_t>(config_of(preset).num_layers));
    const Result f32 = run(ref);
    // Delayed scaling quantises with the scales of earlier steps: one step to observe the amaxes.
    m.refresh_compute_weights();
    run(m);
    for (fp8::LinearQuantizer* q : m.fp8_quantizers()) q->next_step();
    m.refresh_compute_weights();
    Allocator::host().reset_peaks();
    const Result fp8 = run(m);
    ASSERT_TRUE(std::isfinite(fp8.loss));
    EXPECT_NEAR(fp8.loss, f32.loss, 2e-2 * f32.loss);
    EXPECT_NE(fp8.loss, f32.loss);  // FP8 really ran
    const double tol = config.hybrid ? 0.25 : 0.15;
    for (size_t i = 0; i < f32.grads.size(); ++i)
      EXPECT_LT(relative_error(fp8.grads[i], f32.grads[i]), tol) << m.parameters()[i]->name;
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, Fp8Model,
                         ::testing::Values(Case{"delayed_hybrid", fp8::Recipe::Delayed, true},
                                           Case{"tensorwise_e4m3", fp8::Recipe::Tensorwise, false},
                                           Case{"blockwise", fp8::Recipe::Blockwise, false},
                                           Case{"mxfp8", fp8::Recipe::Mxfp8, false}),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

using megaton::testing::kept_activations;

TEST(Fp8ModelMemory, InputsKeptForBackwardAreOneBytePerElement) {
  const auto cfg = megaton::testing::tiny_config("llama-tiny");
  models::TransformerModel f32(cfg), fp8(cfg);
  fp8::Fp8Config config;
  config.recipe = fp8::Recipe::Tensorwise;
  fp8.enable_fp8(config);
  const int64_t a = kept_activations(f32), b = kept_activations(fp8);
  // Each linear keeps x^T at one byte per element instead of x at four; the inputs of the output
  // projections (attention output, activation output) are kept by nothing else.
  const int64_t rows = 2 * 32;
  const int64_t saved_per_layer = 3 * rows * (cfg.hidden_size + cfg.ffn_hidden_size);
  EXPECT_LE(b, a - cfg.num_layers * saved_per_layer) << a << " vs " << b;
}

// Megatron's first_last_layers_bf16: enable_fp8 over a layer range leaves the layers outside it
// (and the embedding and head everywhere) in the compute dtype (planted: the range ignored, caught).
TEST(Fp8Model, OnlyTheLayersInTheRangeRunInFp8) {
  auto cfg = megaton::testing::tiny_config("llama-tiny");
  cfg.num_layers = 4;
  models::TransformerModel m(cfg);
  m.enable_fp8(fp8::Fp8Config{}, 1, 3);
  ASSERT_EQ(m.fp8_quantizers().size(), 2u * 4u);  // layers 1 and 2, four linears each
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    std::vector<nn::Linear*> linears;
    m.layers()[static_cast<size_t>(i)]->linears(linears);
    for (nn::Linear* l : linears) EXPECT_EQ(l->fp8() != nullptr, i == 1 || i == 2) << "layer " << i;
  }
}

}  // namespace
