// Block specs: the model config names the attention and MLP kinds, unknown kinds are rejected
// naming the known ones, a kind registered from outside nn/ trains inside an unchanged block (its
// forward, B and W are all routed through it), and a sublayer context of the wrong kind is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "../support/temp_dir.h"
#include "../support/tiny_model.h"
#include "megaton/models/hf_format.h"
#include "megaton/models/transformer_model.h"
#include "megaton/nn/block_spec.h"
#include "megaton/nn/transformer_block.h"

using namespace megaton;

using megaton::testing::error_message;

namespace {

// A minimal MLP kind: y = x * scale per hidden unit, one parameter. Host loops over f32 (it is a
// test module, not a kernel).
struct ScaleCtx : nn::SublayerCtx {
  Tensor x, dy;
};

class ScaleMlp final : public nn::MlpLayer {
 public:
  ScaleMlp(const std::string& name, int64_t hidden) : scale(name + ".scale", {hidden}, false) {}
  std::unique_ptr<nn::SublayerCtx> new_ctx() const override { return std::make_unique<ScaleCtx>(); }
  Tensor forward(nn::SublayerCtx& c, const Tensor& x, int64_t, int64_t) override {
    nn::ctx_as<ScaleCtx>(c).x = x;
    return apply(x, "scale.out");
  }
  Tensor backward_input(nn::SublayerCtx& c, const Tensor& dy, int64_t, int64_t) override {
    nn::ctx_as<ScaleCtx>(c).dy = dy;
    return apply(dy, "scale.dx");
  }
  void backward_weight(nn::SublayerCtx& c) override {
    auto& ctx = nn::ctx_as<ScaleCtx>(c);
    const int64_t C = scale.value.numel(), N = ctx.x.numel() / C;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < C; ++i)
        scale.grad.data<float>()[i] += ctx.dy.data<float>()[n * C + i] * ctx.x.data<float>()[n * C + i];
    scale.grad_accumulated();
    ctx.x = ctx.dy = {};
  }
  void parameters(nn::ParameterList& out) override { out.push_back(&scale); }
  void gemm_weights(nn::ParameterList&) override {}
  void linears(std::vector<nn::Linear*>&) override {}

  nn::Parameter scale;

 private:
  Tensor apply(const Tensor& x, const char* name) const {
    Tensor y = nn::new_activation(x.shape(), name);
    const int64_t C = scale.value.numel();
    for (int64_t i = 0; i < x.numel(); ++i) y.data<float>()[i] = x.data<float>()[i] * scale.value.data<float>()[i % C];
    return y;
  }
};

void register_scale_kind() {
  static const bool once = [] {
    nn::register_mlp_kind("test_scale", [](const std::string& name, const nn::BlockSpec& s) {
      return std::make_unique<ScaleMlp>(name, s.attn.hidden);
    });
    return true;
  }();
  (void)once;
}

}  // namespace

TEST(BlockSpec, UnknownKindsAreRejectedNamingTheKnownOnes) {
  auto c = megaton::testing::tiny_config("llama-tiny");
  c.attention_type = "latent";
  std::string msg = error_message([&] { c.validate(); });
  EXPECT_NE(msg.find("attention_type 'latent'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("self_attention"), std::string::npos) << msg;
  c.attention_type = "self_attention";
  c.mlp_type = "experts";
  msg = error_message([&] { models::TransformerModel m(c); });
  EXPECT_NE(msg.find("mlp_type 'experts'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dense"), std::string::npos) << msg;

  nn::BlockSpec spec;
  spec.mlp = "experts";
  msg = error_message([&] { nn::make_mlp("x", spec); });
  EXPECT_NE(msg.find("unknown mlp kind 'experts' (known: dense"), std::string::npos) << msg;
  msg = error_message([] { nn::register_attention_kind("self_attention", nullptr); });
  EXPECT_NE(msg.find("already registered"), std::string::npos) << msg;
}

TEST(BlockSpec, ARegisteredMlpKindTrainsInsideAnUnchangedBlock) {
  register_scale_kind();
  const auto kinds = nn::mlp_kinds();
  EXPECT_NE(std::find(kinds.begin(), kinds.end(), "test_scale"), kinds.end());
  auto c = megaton::testing::tiny_config("gpt-tiny");
  c.mlp_type = "test_scale";
  models::TransformerModel m(c);
  m.init_weights(3);
  std::vector<nn::Parameter*> scales;
  for (nn::Parameter* p : m.parameters()) {
    EXPECT_EQ(p->name.find("linear_fc"), std::string::npos) << "a dense MLP weight in a test_scale model: " << p->name;
    if (p->name.find(".mlp.scale") != std::string::npos) scales.push_back(p);
  }
  ASSERT_EQ(scales.size(), 2u);
  for (nn::Parameter* p : scales)
    for (int64_t i = 0; i < p->value.numel(); ++i) p->value.data<float>()[i] = 0.3f + 0.2f * static_cast<float>(i % 7);

  // The gradient the block routes through the kind's B and W equals the loss's directional
  // derivative (central differences) along it: along g / |g| that derivative is |g|.
  const auto batch = megaton::testing::tiny_batch(2, 16);  // named, not bound: clang 14 cannot capture a binding
  const Tensor &in = batch.first, &tg = batch.second;
  nn::zero_grads(m.parameters());
  models::ModelCtx ctx;
  m.forward(ctx, in, tg, true);
  m.backward(ctx);
  nn::Parameter& s0 = *scales[0];
  const std::vector<float> g(s0.grad.data<float>(), s0.grad.data<float>() + s0.grad.numel());
  double analytic = 0;
  for (float v : g) analytic += static_cast<double>(v) * v;
  analytic = std::sqrt(analytic);
  auto loss_at = [&](float delta) {
    const std::vector<float> saved(s0.value.data<float>(), s0.value.data<float>() + s0.value.numel());
    for (size_t i = 0; i < g.size(); ++i) s0.value.data<float>()[i] += delta * g[i] / static_cast<float>(analytic);
    models::ModelCtx eval;
    const double l = m.forward(eval, in, tg, false).loss;
    std::copy(saved.begin(), saved.end(), s0.value.data<float>());
    return l;
  };
  const float eps = 1e-2f;
  const double numeric = (loss_at(eps) - loss_at(-eps)) / (2.0 * eps);
  ASSERT_TRUE(std::isfinite(analytic) && std::isfinite(numeric));
  EXPECT_GT(analytic, 1e-3) << "the scale should matter to the loss";
  EXPECT_NEAR(analytic, numeric, 2e-2 * analytic);

  // No HF format fits a custom kind: export says so instead of writing something wrong.
  const std::string msg = error_message([&] { models::config_to_hf(c); });
  EXPECT_NE(msg.find("mlp_type 'test_scale'"), std::string::npos) << msg;
  EXPECT_NE(error_message([&] { m.layers()[0]->dense_mlp(); }).find("has mlp kind 'test_scale', not dense"),
            std::string::npos);
}

TEST(BlockSpec, ASublayerContextOfTheWrongKindIsRefused) {
  nn::BlockSpec spec;
  spec.attn = {16, 2, 2, 8};
  spec.ffn_hidden = 32;
  nn::TransformerBlock block("decoder.layers.0", spec, nullptr);
  for (nn::Parameter* p : [&] {
         nn::ParameterList ps;
         block.parameters(ps);
         return ps;
       }())
    for (int64_t i = 0; i < p->value.numel(); ++i) p->value.data<float>()[i] = 0.01f * static_cast<float>(i % 5);
  Tensor x = Tensor::zeros({2 * 4, 16}, DType::F32);
  nn::BlockCtx ctx;
  EXPECT_NE(error_message([&] { block.backward_input(ctx, x, 2, 4); }).find("without a forward"), std::string::npos);
  const Tensor y = block.forward(ctx, x, 2, 4);
  std::swap(ctx.attn, ctx.mlp);
  EXPECT_NE(error_message([&] { block.backward_input(ctx, y, 2, 4); }).find("context of the wrong kind"),
            std::string::npos);
}
