// A transformer with the "moe" MLP kind: the layers the config asks for (first_k_dense_replace dense
// ones first), its parameter count, and a tiny MoE model trained end to end by `megaton train`'s
// Trainer whose loss falls and whose expert bias moves.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "../support/byte_dataset.h"
#include "../support/temp_dir.h"
#include "megaton/ckpt/safetensors.h"
#include "megaton/models/hf_format.h"
#include "megaton/models/transformer_model.h"
#include "megaton/train/trainer.h"

using namespace megaton;

namespace {

std::vector<std::string> moe_overrides() {
  return {"model.preset=\"llama-tiny\"", "model.num_layers=2", "model.hidden_size=48", "model.ffn_hidden_size=96",
          "model.num_attention_heads=6", "model.num_query_groups=2", "model.mlp_type=\"moe\"",
          "model.first_k_dense_replace=1", "model.num_moe_experts=4", "model.moe_router_topk=2",
          "model.moe_ffn_hidden_size=32", "model.moe_shared_expert_intermediate_size=32",
          "model.moe_router_score_function=\"sigmoid\"", "model.moe_router_num_groups=2",
          "model.moe_router_group_topk=1", "model.moe_router_norm_topk_prob=true",
          "model.moe_router_load_balancing_type=\"seq_aux_loss\"", "model.moe_aux_loss_coeff=0.01",
          "model.moe_router_enable_expert_bias=true", "model.moe_router_bias_update_rate=0.01"};
}

}  // namespace

TEST(MoeModel, FirstKDenseThenMoeLayersAndTheirParameterCount) {
  auto cfg = train::load_train_config("", moe_overrides());
  models::TransformerModel model(cfg.model);
  ASSERT_EQ(model.layers().size(), 2u);
  EXPECT_NE(dynamic_cast<nn::Mlp*>(model.layers()[0]->mlp.get()), nullptr);
  EXPECT_NE(dynamic_cast<nn::MoeLayer*>(model.layers()[1]->mlp.get()), nullptr);
  EXPECT_EQ(model.moe_layers().size(), 1u);
  EXPECT_EQ(nn::count_parameters(model.parameters()), cfg.model.num_parameters());
  // Active parameters per token: the router, 2 of 4 experts, the shared expert.
  auto dense = cfg.model;
  dense.mlp_type = "dense";
  const double moe_mlp = 48.0 * 4 + 2 * 3 * 48 * 32 + 3 * 48 * 32, dense_mlp = 3 * 48 * 96;
  EXPECT_NEAR(cfg.model.flops_per_token(32) - dense.flops_per_token(32), 6.0 * (moe_mlp - dense_mlp), 1e-6);
}

TEST(MoeModel, SavedUnderDeepSeekV3NamesAndLoadedBack) {
  auto cfg = train::load_train_config("", moe_overrides());
  models::TransformerModel a(cfg.model), b(cfg.model);
  a.init_weights(1);
  for (nn::Parameter* p : a.parameters())  // the expert bias is zero after init: give it values
    if (p->name.ends_with("expert_bias"))
      for (int64_t e = 0; e < p->value.numel(); ++e) p->value.data<float>()[e] = 0.1f * static_cast<float>(e);
  megaton::testing::TempDir dir;
  models::save_hf_model(a, dir.file("hf"));
  const auto tensors = ckpt::load_safetensors(dir.file("hf") + "/model.safetensors");
  for (const char* name : {"model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.gate.weight",
                           "model.layers.1.mlp.gate.e_score_correction_bias",
                           "model.layers.1.mlp.experts.3.up_proj.weight",
                           "model.layers.1.mlp.shared_experts.down_proj.weight"})
    EXPECT_TRUE(tensors.count(name)) << name;
  models::load_hf_tensors(b, tensors, "saved");
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    const Tensor& x = a.parameters()[i]->value;
    const Tensor& y = b.parameters()[i]->value;
    EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << a.parameters()[i]->name;
  }
}

TEST(MoeModel, BadMoeKeysAreErrors) {
  auto o = moe_overrides();
  o.push_back("model.moe_router_group_topk=3");
  EXPECT_ERROR_CONTAINS(train::load_train_config("", o), "moe_router_group_topk");
  o = moe_overrides();
  o.push_back("model.first_k_dense_replace=3");
  EXPECT_ERROR_CONTAINS(train::load_train_config("", o), "first_k_dense_replace");
}

TEST(MoeModel, TinyMoeTrainsAndTheExpertBiasMoves) {
  megaton::testing::TempDir dir;
  megaton::testing::write_byte_dataset(dir.file("train"), 400, 3);
  auto o = moe_overrides();
  for (std::string s : {"data.data_path=\"" + dir.file("train") + "\"", std::string("training.micro_batch_size=4"),
                        std::string("training.global_batch_size=8"), std::string("training.seq_length=32"),
                        std::string("training.train_iters=40"), std::string("training.threads=1"),
                        std::string("optimizer.lr=3e-3"), std::string("optimizer.lr_warmup_iters=5"),
                        "logging.run_dir=\"" + dir.file("run") + "\"", std::string("logging.peak_tflops=1.0")})
    o.push_back(s);
  train::Trainer(train::load_train_config("", o)).run();
  std::vector<double> losses;
  std::ifstream in(dir.file("run") + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (!j.contains("loss") || j["loss"].is_null()) continue;
    losses.push_back(j["loss"].get<double>());
    // One record per MoE layer (layer 1; layer 0 is dense), dropless.
    ASSERT_EQ(j.at("moe").size(), 1u) << line;
    EXPECT_EQ(j["moe"][0].at("dropped_tokens").get<int64_t>(), 0);
    EXPECT_GE(j["moe"][0].at("max_over_mean_load").get<double>(), 1.0);
    EXPECT_GT(j["moe"][0].at("balance_loss").get<double>(), 0.0);
  }
  ASSERT_GE(losses.size(), 10u);
  const double first = std::accumulate(losses.begin(), losses.begin() + 3, 0.0) / 3;
  const double last = std::accumulate(losses.end() - 3, losses.end(), 0.0) / 3;
  EXPECT_LT(last, first - 1.0) << "first steps " << first << ", last steps " << last;
  const auto weights = ckpt::load_safetensors(dir.file("run") + "/final/model.safetensors");
  const Tensor& bias = weights.at("model.layers.1.mlp.gate.e_score_correction_bias");
  double moved = 0;
  for (int64_t e = 0; e < bias.numel(); ++e) moved += std::abs(bias.data<float>()[e]);
  EXPECT_GT(moved, 0.0) << "the expert bias never moved";
}
