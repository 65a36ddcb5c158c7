// The MoE layer (nn/moe/moe_layer.h) against an independent PyTorch implementation
// (tests/python/moe_reference.py, /usr/bin/python3): the layer's output, balancing and z losses, and
// the gradients of sum(dy * y) + losses w.r.t. the input and every weight, for Mixtral-style softmax
// top-2 with the aux loss and z-loss, DeepSeek-V3-style sigmoid group-limited top-k with the expert
// bias, the sequence-wise loss and routed scaling, and a capacity factor that drops tokens. Plus the
// auxiliary-loss-free bias update and the model-level wiring (first_k_dense_replace, training).
#include "megaton/nn/moe/moe_layer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>

#include "../kernels/finite_diff.h"
#include "../support/run_command.h"
#include "../support/temp_dir.h"
#include "megaton/data/npy_file.h"
#include "megaton/models/transformer_model.h"

using namespace megaton;

namespace {

void fill_random(Tensor& t, uint64_t seed, double scale) {
  auto v = fd::random_vector<float>(static_cast<size_t>(t.numel()), seed, -scale, scale);
  std::copy(v.begin(), v.end(), t.data<float>());
}

void save(const megaton::testing::TempDir& dir, const std::string& name, const Tensor& t) {
  const bool ints = t.dtype() == DType::I32;
  data::write_npy(dir.file(name + ".npy"), ints ? "<i4" : "<f4", t.shape(), t.raw(), t.nbytes());
}

// Runs the layer once (forward, B, W) on random weights and inputs, saves everything, and asks the
// PyTorch reference to recompute and compare.
void check_against_torch(const nn::MoeConfig& c, int64_t B, int64_t T, const std::string& options) {
  const int64_t C = 12, N = B * T;
  nn::MoeLayer layer("mlp", C, c);
  fill_random(layer.router.weight.value, 1, 0.8);
  fill_random(layer.fc1.value, 2, 0.4);
  fill_random(layer.fc2.value, 3, 0.4);
  if (layer.expert_bias.value.defined()) fill_random(layer.expert_bias.value, 4, 0.1);
  if (layer.shared) {
    fill_random(layer.shared->fc1.weight.value, 5, 0.4);
    fill_random(layer.shared->fc2.weight.value, 6, 0.4);
  }
  Tensor x = Tensor::empty({N, C}, DType::F32, MemCategory::Other, "x"), dy = Tensor::empty({N, C}, DType::F32);
  fill_random(x, 7, 1.0);
  fill_random(dy, 8, 1.0);
  auto ctx = layer.new_ctx();
  Tensor y = layer.forward(*ctx, x, B, T);
  Tensor dx = layer.backward_input(*ctx, dy, B, T);
  layer.backward_weight(*ctx);

  megaton::testing::TempDir dir;
  nn::ParameterList params;
  layer.parameters(params);
  for (nn::Parameter* p : params) {
    save(dir, p->name, p->value);
    save(dir, p->name + ".grad", p->grad);
  }
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"x", &x}, {"dy", &dy}, {"y", &y}, {"dx", &dx}})
    save(dir, name, *t);
  const nn::MoeStats& s = layer.stats();
  std::ofstream(dir.file("stats.txt")) << std::setprecision(17) << s.balance_loss << " " << s.z_loss << " "
                                       << s.dropped << " " << s.max_load << " " << s.mean_load << "\n";
  const std::string cmd = "/usr/bin/python3 " + std::string(MEGATON_SOURCE_DIR) + "/tests/python/moe_reference.py " +
                          dir.file("") + " --B " + std::to_string(B) + " --T " + std::to_string(T) + " " + options;
  const auto r = megaton::testing::run_command(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
}

nn::MoeConfig mixtral_like() {
  nn::MoeConfig c;
  c.num_moe_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 10;
  c.moe_shared_expert_intermediate_size = 8;
  c.moe_router_norm_topk_prob = true;
  c.moe_aux_loss_coeff = 0.05;
  c.moe_z_loss_coeff = 0.01;
  return c;
}

nn::MoeConfig deepseek_like() {
  nn::MoeConfig c;
  c.num_moe_experts = 8;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 6;
  c.moe_shared_expert_intermediate_size = 6;
  c.moe_router_score_function = "sigmoid";
  c.moe_router_num_groups = 4;
  c.moe_router_group_topk = 2;
  c.moe_router_norm_topk_prob = true;
  c.moe_router_topk_scaling_factor = 2.5;
  c.moe_router_load_balancing_type = "seq_aux_loss";
  c.moe_aux_loss_coeff = 0.02;
  c.moe_router_enable_expert_bias = true;
  return c;
}

}  // namespace

TEST(MoeLayerTorch, SoftmaxTop2WithAuxAndZLoss) {
  check_against_torch(mixtral_like(), 2, 5, "--score softmax --pre-softmax 1 --norm-topk 1 --aux aux_loss "
                                             "--aux-coeff 0.05 --z-coeff 0.01 --E 4 --K 2");
}

TEST(MoeLayerTorch, SigmoidGroupLimitedWithBiasAndSequenceLoss) {
  check_against_torch(deepseek_like(), 3, 4, "--score sigmoid --groups 4 --topk-groups 2 --norm-topk 1 --scaling 2.5 "
                                             "--aux seq_aux_loss --aux-coeff 0.02 --E 8 --K 2");
}

TEST(MoeLayerTorch, CapacityFactorDropsByProbs) {
  nn::MoeConfig c = mixtral_like();
  c.moe_router_pre_softmax = false;
  c.moe_router_norm_topk_prob = false;
  c.moe_expert_capacity_factor = 1.0;
  c.moe_z_loss_coeff = 0.0;
  check_against_torch(c, 2, 8, "--score softmax --pre-softmax 0 --aux aux_loss --aux-coeff 0.05 --capacity 1.0 "
                               "--E 4 --K 2");
}

TEST(MoeLayer, ExpertBiasMovesTowardsTheMeanLoad) {
  nn::MoeConfig c = deepseek_like();
  c.moe_router_bias_update_rate = 0.25;
  nn::MoeLayer layer("mlp", 4, c);
  fill_random(layer.router.weight.value, 1, 0.5);
  Tensor x = Tensor::empty({16, 4}, DType::F32), dy = Tensor::zeros({16, 4}, DType::F32);
  fill_random(x, 2, 1.0);
  layer.begin_step();
  auto ctx = layer.new_ctx();
  layer.forward(*ctx, x, 2, 8);
  const std::vector<int64_t> load = [&] {
    // What the plan counted: recompute from the selection the layer made.
    std::vector<int64_t> l(8, 0);
    auto& m = nn::ctx_as<nn::MoeCtx>(*ctx);
    for (int64_t i = 0; i < m.indices.numel(); ++i) ++l[static_cast<size_t>(m.indices.data<int32_t>()[i])];
    return l;
  }();
  layer.backward_input(*ctx, dy, 2, 8);
  layer.backward_weight(*ctx);
  layer.update_expert_bias({});
  const double mean = 16.0 * 2 / 8;
  for (size_t e = 0; e < 8; ++e) {
    const float want = load[e] < mean ? 0.25f : load[e] > mean ? -0.25f : 0.0f;
    EXPECT_EQ(layer.expert_bias.value.data<float>()[e], want) << "expert " << e << " load " << load[e];
  }
  EXPECT_EQ(layer.step_stats().max_load, static_cast<double>(*std::max_element(load.begin(), load.end())));
  EXPECT_EQ(layer.step_stats().mean_load, mean);
  // Forward alone (evaluation) does not count.
  layer.begin_step();
  layer.forward(*layer.new_ctx(), x, 2, 8);
  layer.update_expert_bias({});
  for (size_t e = 0; e < 8; ++e) {
    const float want = load[e] < mean ? 0.25f : load[e] > mean ? -0.25f : 0.0f;
    EXPECT_EQ(layer.expert_bias.value.data<float>()[e], want);
  }
}

TEST(MoeLayer, CapacityFactorReportsDroppedTokensAndDroplessNone) {
  nn::MoeConfig c = mixtral_like();
  nn::MoeLayer dropless("mlp", 12, c);
  c.moe_expert_capacity_factor = 1.0;
  nn::MoeLayer capped("mlp", 12, c);
  // A router that sends every token to experts 0 and 1.
  for (nn::MoeLayer* l : {&dropless, &capped}) {
    l->router.weight.value.zero_();
    for (int64_t i = 0; i < 12; ++i) l->router.weight.value.data<float>()[i] = 1.0f, l->router.weight.value.data<float>()[12 + i] = 0.5f;
  }
  Tensor x = Tensor::empty({16, 12}, DType::F32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 1.0f;
  dropless.forward(*dropless.new_ctx(), x, 2, 8);
  capped.forward(*capped.new_ctx(), x, 2, 8);
  EXPECT_EQ(dropless.stats().dropped, 0);
  EXPECT_EQ(dropless.stats().max_load, 16.0);
  EXPECT_EQ(dropless.stats().mean_load, 8.0);
  EXPECT_EQ(capped.stats().dropped, 16);  // capacity 8 per expert: 8 of each of experts 0 and 1's 16 go
}

TEST(MoeLayer, ConfigErrorsNameTheKey) {
  nn::MoeConfig c = deepseek_like();
  c.moe_router_group_topk = 5;
  EXPECT_ERROR_CONTAINS(nn::MoeLayer("mlp", 4, c), "moe_router_group_topk");
  c = deepseek_like();
  c.moe_router_score_function = "relu";
  EXPECT_ERROR_CONTAINS(nn::MoeLayer("mlp", 4, c), "moe_router_score_function");
  c = deepseek_like();
  c.moe_aux_loss_coeff = std::nan("");
  EXPECT_ERROR_CONTAINS(nn::MoeLayer("mlp", 4, c), "moe_aux_loss_coeff");
}

TEST(MoeLayer, AuxLossFreeBiasBalancesASkewedRouter) {
  // A router that sends every token to experts 0 and 1 (max / mean load 4 with 8 experts, top-2);
  // the weights stay frozen, so only the bias can move the load.
  for (bool bias_on : {true, false}) {
    nn::MoeConfig c = deepseek_like();
    c.moe_router_num_groups = c.moe_router_group_topk = 1;
    c.moe_router_enable_expert_bias = bias_on;
    c.moe_router_bias_update_rate = 0.005;
    nn::MoeLayer layer("mlp", 8, c);
    // Feature 0 is 1 for every token and weighs +1 for experts 0 and 1, -1 for the others; the
    // other features differ per token, so tokens rank the experts differently.
    fill_random(layer.router.weight.value, 11, 0.5);
    float* w = layer.router.weight.value.data<float>();
    for (int64_t e = 0; e < 8; ++e) w[e * 8] = e < 2 ? 1.0f : -1.0f;
    Tensor x = Tensor::empty({64, 8}, DType::F32), dy = Tensor::zeros({64, 8}, DType::F32);
    fill_random(x, 9, 1.0);
    for (int64_t n = 0; n < 64; ++n) x.data<float>()[n * 8] = 1.0f;
    double first = 0, last = 0;
    fd::with_threads(1, [&] {
    for (int step = 0; step < 200; ++step) {
      layer.begin_step();
      auto ctx = layer.new_ctx();
      layer.forward(*ctx, x, 4, 16);
      layer.backward_input(*ctx, dy, 4, 16);
      layer.backward_weight(*ctx);
      const double ratio = layer.step_stats().max_load / layer.step_stats().mean_load;
      if (step == 0) first = ratio;
      last = ratio;
      layer.update_expert_bias({});
    }
    });
    EXPECT_EQ(first, 4.0);
    if (bias_on)
      EXPECT_LT(last, 1.3) << "the bias did not balance the load in 200 steps";
    else
      EXPECT_EQ(last, 4.0) << "without the bias the load cannot change";
  }
}
