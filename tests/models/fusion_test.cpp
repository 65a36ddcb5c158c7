// Fused kernels at model level (nn/fusion.h): each fusion gives the unfused model's loss and
// gradients to f32 rounding (the residual add + norm's forward bitwise; its backward adds the
// residual gradient inside the norm's last expression, which the compiler may contract into an
// FMA; the bias + activation sums the bias outside fc1's GEMM), through the fused backward and
// through B then W, for GPT (LayerNorm, GeLU, biases) and Llama (RMSNorm, SwiGLU; given biases here
// so that its bias fusion runs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>

#include "../support/tiny_model.h"
#include "../kernels/finite_diff.h"
#include "megaton/models/transformer_model.h"
#include "megaton/nn/mlp.h"
#include "megaton/nn/param_and_grad_buffer.h"

using namespace megaton;

namespace {

models::TransformerConfig config_of(const std::string& preset) {
  models::TransformerConfig c = megaton::testing::tiny_config(preset);
  c.add_bias_linear = true;
  return c;
}

struct Outcome {
  double loss;
  std::vector<std::vector<double>> grads;
};

// fusion: what set_fusion is given; none: the model as constructed.
Outcome run(const std::string& preset, std::optional<nn::FusionConfig> fusion, DType dtype, bool split_backward) {
  models::TransformerModel m(config_of(preset));
  m.init_weights(9);
  megaton::testing::give_biases_and_norms_values(m.parameters());
  m.set_compute_dtype(dtype);
  if (fusion) m.set_fusion(*fusion);
  m.refresh_compute_weights();
  nn::ParamAndGradBuffer buf(m.parameters(), 0);
  double loss = 0;
  for (int mb = 0; mb < 2; ++mb) {  // gradients accumulate over two micro-batches
    auto [in, tg] = megaton::testing::tiny_batch(2, 16 + 8 * mb);
    models::ModelCtx ctx;
    loss += m.forward(ctx, in, tg, true, 0.5f).loss;
    if (split_backward) {
      m.backward_input(ctx);
      m.backward_weight(ctx);
    } else {
      m.backward(ctx);
    }
  }
  return {loss, megaton::testing::gradients_of(m.parameters())};
}

bool bitwise_equal(const Outcome& a, const Outcome& b) {
  return megaton::testing::bitwise_equal(a.loss, a.grads, b.loss, b.grads);
}

// The largest per-parameter relative error of a's gradients against b's (NaN propagates).
double worst_relative_error(const Outcome& a, const Outcome& b) {
  double worst = 0;
  for (size_t i = 0; i < b.grads.size(); ++i) {
    const double e = megaton::testing::relative_error(a.grads[i], b.grads[i]);
    if (!(e <= worst)) worst = e;  // NaN too
  }
  return worst;
}

// The FP8-only fusions (layernorm_linear, layernorm_mlp) change nothing here: tests/models/fp8_fusion_test.cpp.
constexpr nn::FusionConfig kNone{.bias_activation = false, .residual_norm = false};
constexpr nn::FusionConfig kResidualNorm{.bias_activation = false, .residual_norm = true};
constexpr nn::FusionConfig kBiasActivation{.bias_activation = true, .residual_norm = false};
constexpr nn::FusionConfig kBoth{.bias_activation = true, .residual_norm = true};

}  // namespace

TEST(Fusion, ResidualNormGivesTheUnfusedLossBitwiseAndItsGradientsToRounding) {
  for (const std::string preset : {"gpt-tiny", "llama-tiny"})
    for (const bool split : {false, true}) {
      SCOPED_TRACE(preset + (split ? " B then W" : " fused backward"));
      const Outcome unfused = run(preset, kNone, DType::F32, split);
      const Outcome fused = run(preset, kResidualNorm, DType::F32, split);
      EXPECT_EQ(fused.loss, unfused.loss);
      EXPECT_LT(worst_relative_error(fused, unfused), 1e-6);
    }
}

TEST(Fusion, BiasActivationMatchesTheUnfusedModelToRounding) {
  for (const std::string preset : {"gpt-tiny", "llama-tiny"})
    for (const bool split : {false, true}) {
      SCOPED_TRACE(preset + (split ? " B then W" : " fused backward"));
      const Outcome unfused = run(preset, kNone, DType::F32, split);
      const Outcome fused = run(preset, kBiasActivation, DType::F32, split);
      EXPECT_LT(std::abs(fused.loss - unfused.loss), 1e-6 * std::abs(unfused.loss));
      EXPECT_LT(worst_relative_error(fused, unfused), 1e-6);
      // B then W sums fc1's bias gradient in B, as the fused backward does: bitwise the same.
      if (split) {
        EXPECT_TRUE(bitwise_equal(fused, run(preset, kBiasActivation, DType::F32, false)));
      }
    }
}

TEST(Fusion, EveryFusionInBf16StaysWithinBf16RoundingOfTheUnfusedModel) {
  for (const std::string preset : {"gpt-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    const Outcome unfused = run(preset, kNone, DType::BF16, false);
    const Outcome fused = run(preset, kBoth, DType::BF16, false);
    EXPECT_LT(std::abs(fused.loss - unfused.loss), 1e-2 * std::abs(unfused.loss));
    EXPECT_LT(worst_relative_error(fused, unfused), 3e-2);
  }
}

TEST(Fusion, ModelsAreBuiltWithEveryFusionOn) {
  EXPECT_TRUE(bitwise_equal(run("gpt-tiny", std::nullopt, DType::F32, false), run("gpt-tiny", kBoth, DType::F32, false)));
}

// With the fusion on, fc1 keeps x W^T without its bias (the activation adds it), off it keeps
// x W^T + b; the MLP's output is the same to rounding. An MLP starts fused.
TEST(Fusion, Fc1LeavesItsBiasToTheActivationWhenFused) {
  for (const auto act : {nn::Activation::GeLU, nn::Activation::SwiGLU}) {
    SCOPED_TRACE(act == nn::Activation::GeLU ? "gelu" : "swiglu");
    const int64_t H = 8, F = 12, N = 5;
    nn::Mlp mlp("mlp", H, F, act, /*bias=*/true);
    uint64_t seed = 50;
    for (nn::Parameter* p : std::vector<nn::Parameter*>{&mlp.fc1.weight, &mlp.fc1.bias, &mlp.fc2.weight, &mlp.fc2.bias}) {
      const auto v = fd::random_vector<float>(static_cast<size_t>(p->value.numel()), ++seed);
      std::copy(v.begin(), v.end(), p->value.data<float>());
    }
    Tensor x = Tensor::empty({N, H}, DType::F32);
    const auto xv = fd::random_vector<float>(N * H, 60);
    std::copy(xv.begin(), xv.end(), x.data<float>());
    auto forward = [&] {
      auto ctx = mlp.new_ctx();
      const Tensor y = mlp.forward(*ctx, x, 1, N);
      const Tensor& h = nn::ctx_as<nn::MlpCtx>(*ctx).h;
      return std::pair{std::vector<double>(y.data<float>(), y.data<float>() + y.numel()),
                       std::vector<double>(h.data<float>(), h.data<float>() + h.numel())};
    };
    const auto [y_fused, h_fused] = forward();  // as constructed
    mlp.set_bias_activation_fusion(false);
    const auto [y_unfused, h_unfused] = forward();
    const int64_t width = mlp.fc1.out_features();
    std::vector<double> h_plus_bias(h_fused);
    for (size_t i = 0; i < h_plus_bias.size(); ++i) h_plus_bias[i] += mlp.fc1.bias.value.data<float>()[i % width];
    EXPECT_TRUE(fd::close(h_plus_bias, h_unfused, 1e-6));
    EXPECT_FALSE(fd::close(h_fused, h_unfused, 1e-2));
    EXPECT_TRUE(fd::close(y_fused, y_unfused, 1e-6));
  }
}
