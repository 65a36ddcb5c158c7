#include "megaton/models/hf_format.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <tuple>

#include "../support/byte_dataset.h"
#include "../support/config_fields.h"
#include "../support/temp_dir.h"
#include "../support/tiny_model.h"
#include "megaton/ckpt/safetensors.h"
#include "megaton/data/token_stream.h"
#include "megaton/train/evaluate.h"

using namespace megaton;
using megaton::testing::same_config;
using megaton::testing::TempDir;

namespace {

// What a config.json carries of a config: neither the preset name nor the init std (training
// only); Llama's head dim explicitly (head_dim) and its RoPE in HF's rotate_half layout only (an
// interleaved model's q/k rows are permuted on export); GPT-2's head dim implied by n_embd / n_head
// and no rotary settings at all; Mixtral's one intermediate_size, the experts' (no dense MLP).
models::TransformerConfig as_exported(models::TransformerConfig c) {
  const models::TransformerConfig defaults;
  c.name = "custom";
  c.init_method_std = defaults.init_method_std;
  if (c.is_mla()) {  // DeepSeek's format: interleaved rope, no head_dim key
    c.kv_channels = defaults.kv_channels;
    return c;
  }
  c.rope_layout = kernels::RopeLayout::Half;
  if (models::is_mixtral_shaped(c)) c.ffn_hidden_size = c.moe.moe_ffn_hidden_size;
  if (c.position_embedding == models::PositionEmbedding::Rope) {
    c.kv_channels = c.head_dim();
  } else {
    c.kv_channels = defaults.kv_channels;
    c.rotary_base = defaults.rotary_base;
    c.rope_scaling = defaults.rope_scaling;
  }
  return c;
}

void expect_same_parameters(models::TransformerModel& a, models::TransformerModel& b) {
  ASSERT_EQ(a.parameters().size(), b.parameters().size());
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    const Tensor& x = a.parameters()[i]->value;
    const Tensor& y = b.parameters()[i]->value;
    ASSERT_EQ(x.shape(), y.shape()) << a.parameters()[i]->name;
    EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << a.parameters()[i]->name;
  }
}

}  // namespace

class HfRoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(HfRoundTrip, ExportThenImportIsBitExact) {
  TempDir dir;
  models::TransformerModel m(megaton::testing::tiny_config(GetParam()));
  m.init_weights(11);
  models::save_hf_model(m, dir.file("model"));
  auto back = models::load_hf_model(dir.file("model"));
  EXPECT_TRUE(same_config(back->config(), as_exported(m.config())));
  expect_same_parameters(m, *back);
  // A second export of the re-imported model is byte-identical too.
  models::save_hf_model(*back, dir.file("again"));
  EXPECT_EQ(megaton::testing::read_bytes(dir.file("model/model.safetensors")),
            megaton::testing::read_bytes(dir.file("again/model.safetensors")));
}

INSTANTIATE_TEST_SUITE_P(Presets, HfRoundTrip, ::testing::Values("gpt-tiny", "llama-tiny", "mixtral-tiny", "deepseek-v3-tiny"),
                         [](const auto& info) { return info.param.substr(0, info.param.find('-')); });

// Mixtral folders: HF's keys and names (block_sparse_moe.gate, experts.E.w1 / w2 / w3); the
// balancing loss only when HF would train with it (output_router_logits); sliding-window attention
// and router jitter refused; an MoE Mixtral cannot express (a shared expert) keeps DeepSeek-V3's names.
TEST(HfFormat, MixtralConfigAndTensorNames) {
  TempDir dir;
  models::TransformerModel m(megaton::testing::tiny_config("mixtral-tiny"));
  models::save_hf_model(m, dir.file("model"));
  const auto cfg = nlohmann::json::parse(megaton::testing::read_bytes(dir.file("model/config.json")));
  EXPECT_EQ(cfg.at("model_type"), "mixtral");
  EXPECT_EQ(cfg.at("architectures"), nlohmann::json::array({"MixtralForCausalLM"}));
  EXPECT_EQ(cfg.at("num_local_experts"), 8);
  EXPECT_EQ(cfg.at("num_experts_per_tok"), 2);
  EXPECT_EQ(cfg.at("router_aux_loss_coef"), 0.02);
  EXPECT_EQ(cfg.at("output_router_logits"), true);
  const auto tensors = ckpt::load_safetensors(dir.file("model/model.safetensors"));
  for (const char* name : {"model.layers.1.block_sparse_moe.gate.weight", "model.layers.1.block_sparse_moe.experts.7.w1.weight",
                           "model.layers.1.block_sparse_moe.experts.7.w2.weight", "model.layers.0.block_sparse_moe.experts.0.w3.weight"})
    EXPECT_TRUE(tensors.count(name)) << name;
  EXPECT_EQ(tensors.at("model.layers.1.block_sparse_moe.experts.7.w2.weight").shape(), (Shape{48, 256}));

  auto off = cfg;
  off["output_router_logits"] = false;
  EXPECT_EQ(models::config_from_hf(off, "x").moe.moe_aux_loss_coeff, 0.0);
  for (const auto& [key, value, message] : std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
           {"sliding_window", 16, "sliding-window attention is not supported"},
           {"router_jitter_noise", 0.1, "router_jitter_noise"},
           {"num_local_experts", nullptr, "missing key 'num_local_experts'"}}) {
    auto bad = cfg;
    bad[key] = value;
    try {
      models::config_from_hf(bad, "cfg.json");
      ADD_FAILURE() << key << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
  auto shared = megaton::testing::tiny_config("mixtral-tiny");
  shared.moe.moe_shared_expert_intermediate_size = 32;
  EXPECT_FALSE(models::is_mixtral_shaped(shared));
  EXPECT_EQ(models::config_to_hf(shared).at("model_type"), "megaton_llama_moe");
}

// linear_qkv's rows follow Megatron's per-query-group layout: per kv group its q heads, then its k
// head, then its v head. The expected order is built here by concatenation, not by the index
// arithmetic of AttentionShape::fused_row, and every exported weight and bias element is checked
// against it. llama-tiny has 6 q heads in 2 groups and gpt-tiny 6 heads of its own group each, so
// HF's [all q | all k | all v] order (an identity mapping) fails both.
class HfLinearQkv : public ::testing::TestWithParam<std::string> {};

TEST_P(HfLinearQkv, RowsArePerQueryGroup) {
  const auto cfg = megaton::testing::tiny_config(GetParam());
  const bool gpt2 = GetParam() == "gpt-tiny";
  models::TransformerModel m(cfg);
  m.init_weights(3);
  const int64_t H = cfg.num_attention_heads, G = cfg.num_query_groups, D = cfg.head_dim(), C = cfg.hidden_size;
  // Per linear_qkv row: which of q (0), k (1), v (2), and the row within HF's q_proj / k_proj / v_proj.
  std::vector<std::pair<int, int64_t>> order;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t h = g * (H / G); h < (g + 1) * (H / G); ++h)
      for (int64_t d = 0; d < D; ++d) order.emplace_back(0, h * D + d);
    for (int part : {1, 2})
      for (int64_t d = 0; d < D; ++d) order.emplace_back(part, g * D + d);
  }
  ASSERT_EQ(static_cast<int64_t>(order.size()), cfg.qkv_size());
  auto& qkv = m.layers()[1]->self_attention().qkv;
  if (gpt2)  // init_weights zeroes biases; distinct values make the bias permutation visible
    for (int64_t row = 0; row < cfg.qkv_size(); ++row) qkv.bias.value.data<float>()[row] = 0.5f + float(row);
  auto exported = models::to_hf_tensors(m);
  const std::map<std::string, Tensor> hf(exported.begin(), exported.end());
  const float* w = qkv.weight.value.data<float>();
  const char* llama_names[] = {"q_proj", "k_proj", "v_proj"};
  for (size_t row = 0; row < order.size(); ++row) {
    const auto [part, r] = order[row];
    for (int64_t c = 0; c < C; ++c) {
      // GPT-2's c_attn is Conv1D [in, out] with outputs [q | k | v], C each.
      const float want = gpt2 ? hf.at("transformer.h.1.attn.c_attn.weight").data<float>()[c * 3 * C + part * C + r]
                              : hf.at(std::string("model.layers.1.self_attn.") + llama_names[part] + ".weight")
                                    .data<float>()[r * C + c];
      ASSERT_EQ(w[row * C + c], want) << "linear_qkv row " << row << " column " << c;
    }
    if (gpt2) {
      ASSERT_EQ(qkv.bias.value.data<float>()[row],
                hf.at("transformer.h.1.attn.c_attn.bias").data<float>()[part * C + r])
          << "linear_qkv bias row " << row;
    }
  }
  // and the import puts every element back
  models::TransformerModel back(cfg);
  models::load_hf_tensors(back, hf, "exported");
  expect_same_parameters(m, back);
}

INSTANTIATE_TEST_SUITE_P(Presets, HfLinearQkv, ::testing::Values("gpt-tiny", "llama-tiny"));

TEST(HfFormat, Gpt2UsesConv1DLayoutAndAcceptsBareNames) {
  TempDir dir;
  models::TransformerModel m(megaton::testing::tiny_config("gpt-tiny"));
  m.init_weights(5);
  auto tensors = models::to_hf_tensors(m);
  std::map<std::string, Tensor> bare;
  for (auto& [name, t] : tensors) {
    if (name == "transformer.h.0.attn.c_attn.weight") {
      EXPECT_EQ(t.shape(), (Shape{48, 3 * 48}));  // [in, out]
      // Conv1D is transposed: column 7 (q head 0, which leads linear_qkv's first group too) is row 7.
      const float* w = m.layers()[0]->self_attention().qkv.weight.value.data<float>();
      EXPECT_EQ(t.data<float>()[1 * 144 + 7], w[7 * 48 + 1]);
    }
    bare[name.substr(name.rfind("transformer.", 0) == 0 ? 12 : 0)] = t;
  }
  models::TransformerModel m2(megaton::testing::tiny_config("gpt-tiny"));
  models::load_hf_tensors(m2, bare, "bare");
  expect_same_parameters(m, m2);
}

TEST(HfFormat, InterleavedRopeExportsInHfLayoutWithTheSameLoss) {
  // A Llama trained with Meta's interleaved RoPE exports permuted q/k rows so that HF's
  // rotate_half model (what load_hf_model builds) computes the same function.
  TempDir dir;
  auto cfg = megaton::testing::tiny_config("llama-tiny");
  cfg.rope_layout = kernels::RopeLayout::Interleaved;
  cfg.init_method_std = 0.3;  // sharp attention, so that positions (and the RoPE layout) matter
  models::TransformerModel m(cfg);
  m.init_weights(9);
  megaton::testing::write_byte_dataset(dir.file("data"), 40);
  data::StreamSamples stream(std::make_shared<data::TokenStream>(dir.file("data")), 32);
  const double loss = train::evaluate(m, stream, 4, 8).loss;
  models::save_hf_model(m, dir.file("model"));
  auto back = models::load_hf_model(dir.file("model"));
  EXPECT_EQ(back->config().rope_layout, kernels::RopeLayout::Half);
  EXPECT_NEAR(train::evaluate(*back, stream, 4, 8).loss, loss, 1e-5 * loss);
  // and the layouts really differ: the same weights under the other layout give another loss
  models::TransformerModel wrong(cfg);
  for (size_t i = 0; i < wrong.parameters().size(); ++i)
    wrong.parameters()[i]->value.copy_from(back->parameters()[i]->value);
  EXPECT_GT(std::abs(train::evaluate(wrong, stream, 4, 8).loss - loss), 1e-3);
}

TEST(HfFormat, MissingOrMisshapenTensorsAreNamed) {
  TempDir dir;
  models::TransformerModel m(megaton::testing::tiny_config("llama-tiny"));
  m.init_weights(1);
  auto tensors = models::to_hf_tensors(m);
  std::map<std::string, Tensor> map(tensors.begin(), tensors.end());
  auto missing = map;
  missing.erase("model.layers.1.mlp.up_proj.weight");
  auto msg = megaton::testing::error_message([&] { models::load_hf_tensors(m, missing, "f.safetensors"); });
  EXPECT_NE(msg.find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << msg;
  auto wrong = map;
  wrong["model.norm.weight"] = Tensor::zeros({47}, DType::F32);
  msg = megaton::testing::error_message([&] { models::load_hf_tensors(m, wrong, "f.safetensors"); });
  EXPECT_NE(msg.find("model.norm.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[48]"), std::string::npos) << msg;
  auto extra = map;
  extra["model.layers.7.mlp.up_proj.weight"] = Tensor::zeros({1}, DType::F32);
  EXPECT_THROW(models::load_hf_tensors(m, extra, "f.safetensors"), Error);
}

// Every field survives config_to_hf -> config_from_hf. Besides the presets, variants set each
// carried field away from both the preset and the importer's default for a missing key, so that a
// key the exporter drops or the importer ignores changes the result.
TEST(HfFormat, ConfigJsonRoundTripsEveryFieldAndRejectsUnknownTypes) {
  std::vector<models::TransformerConfig> configs;
  for (const auto& name : models::preset_names()) configs.push_back(models::preset(name));
  auto gpt2 = models::preset("gpt2-124m");
  gpt2.vocab_size = 50000;
  gpt2.max_position_embeddings = 2048;
  gpt2.ffn_hidden_size = 3000;
  gpt2.norm_epsilon = 3e-6;
  gpt2.tie_embeddings = false;
  configs.push_back(gpt2);
  auto llama = models::preset("llama3-1b");
  llama.kv_channels = 96;  // not hidden / heads = 64
  llama.num_query_groups = 4;
  llama.max_position_embeddings = 4096;
  llama.rotary_base = 123456.0;
  llama.rope_scaling = {16.0, 2.0, 8.0, 4096.0};
  llama.norm_epsilon = 2e-6;
  llama.tie_embeddings = false;
  llama.rope_layout = kernels::RopeLayout::Interleaved;  // exported as half
  configs.push_back(llama);
  auto deepseek = models::preset("deepseek-v3-tiny");
  deepseek.mla = {40, 24, 12, 6, 20};
  deepseek.first_k_dense_replace = 2;
  deepseek.mtp_num_layers = 2;
  deepseek.moe.moe_shared_expert_intermediate_size = 2 * deepseek.moe.moe_ffn_hidden_size;
  deepseek.moe.moe_router_load_balancing_type = "aux_loss";
  deepseek.moe.moe_aux_loss_coeff = 0.003;
  deepseek.rope_scaling = {8.0, 1.0, 4.0, 128.0, true, 16.0, 2.0, 0.9, 0.7};
  configs.push_back(deepseek);

  for (const auto& c : configs) {
    const auto back = models::config_from_hf(models::config_to_hf(c), "x");
    EXPECT_TRUE(same_config(back, as_exported(c))) << c.name;
  }
  EXPECT_THROW(models::config_from_hf({{"model_type", "bert"}}, "x"), Error);
  EXPECT_THROW(models::config_from_hf({{"model_type", "gpt2"}, {"n_embd", 10}}, "x"), Error);
}

TEST(Presets, ParameterCountsMatchThePublishedModels) {
  EXPECT_EQ(models::preset("gpt2-124m").num_parameters(), 124439808);
  EXPECT_EQ(models::preset("gpt2-350m").num_parameters(), 354823168);
  EXPECT_EQ(models::preset("llama3-8b").num_parameters(), 8030261248);
  EXPECT_EQ(models::preset("llama3-1b").num_parameters(), 1235814400);
  EXPECT_EQ(models::preset("mixtral-8x7b").num_parameters(), 46702792704);  // HF's Mixtral-8x7B-v0.1
  // DeepSeek publishes rounded counts: V3 671B in its main model (37B per token), its MTP module
  // ~14B of which 2 x vocab x hidden are its copies of the embedding and head (shared here); V2-Lite
  // 15.7B.
  auto v3 = models::preset("deepseek-v3-671b");
  const double v3_all = static_cast<double>(v3.num_parameters());
  v3.mtp_num_layers = 0;
  EXPECT_NEAR(static_cast<double>(v3.num_parameters()) / 671e9, 1.0, 2e-3);
  EXPECT_NEAR(static_cast<double>(v3.num_parameters(true)) / 37e9, 1.0, 0.03);
  EXPECT_NEAR((v3_all - static_cast<double>(v3.num_parameters()) + 2.0 * 129280 * 7168) / 14e9, 1.0, 0.05);
  EXPECT_NEAR(static_cast<double>(models::preset("deepseek-v2-lite").num_parameters()) / 15.7e9, 1.0, 2e-3);
  auto bad = models::preset("gpt-tiny");
  bad.num_attention_heads = 5;
  bad.num_query_groups = 5;
  EXPECT_THROW(bad.validate(), Error);
}

// Issue 8, principles 1 and 7: config.json values are read strictly, and every wrong one is an error
// naming the file and the key (never a bare JSON-library message, never silently converted: 12.5
// layers used to load as 12, `true` as 1).
TEST(HfFormat, WrongTypedConfigFieldsNameTheFileAndKey) {
  const nlohmann::json gpt2 = models::config_to_hf(models::preset("gpt-tiny"));
  const nlohmann::json llama = models::config_to_hf(models::preset("llama-tiny"));
  ASSERT_NO_THROW(models::config_from_hf(gpt2, "good.json"));
  struct Case {
    nlohmann::json base;
    std::string key;
    nlohmann::json value;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {gpt2, "n_layer", "12", "cfg.json: key 'n_layer' must be an integer, got \"12\" (string)"},
           {gpt2, "n_layer", 2.5, "cfg.json: key 'n_layer' must be an integer, got 2.5 (number)"},
           {gpt2, "n_layer", 2.0, "cfg.json: key 'n_layer' must be an integer, got 2.0 (number)"},
           {gpt2, "n_embd", true, "cfg.json: key 'n_embd' must be an integer, got true (boolean)"},
           {gpt2, "vocab_size", nlohmann::json(UINT64_MAX), "cfg.json: key 'vocab_size' = 18446744073709551615 is out of range"},
           {gpt2, "tie_word_embeddings", "yes", "cfg.json: key 'tie_word_embeddings' must be true or false, got \"yes\""},
           {gpt2, "tie_word_embeddings", 1, "cfg.json: key 'tie_word_embeddings' must be true or false, got 1"},
           {gpt2, "layer_norm_epsilon", "1e-5", "cfg.json: key 'layer_norm_epsilon' must be a number, got \"1e-5\""},
           {gpt2, "activation_function", 7, "cfg.json: key 'activation_function' must be a string, got 7"},
           {gpt2, "model_type", nlohmann::json::array({"gpt2"}), "cfg.json: key 'model_type' must be a string"},
           {llama, "num_key_value_heads", 1.5, "cfg.json: key 'num_key_value_heads' must be an integer"},
           {llama, "rope_scaling", 8, "cfg.json: key 'rope_scaling' must be an object, got 8"},
           {llama, "rope_scaling", {{"rope_type", "llama3"}, {"factor", "8"}},
            "cfg.json rope_scaling: key 'factor' must be a number, got \"8\""},
           {llama, "attention_bias", "false", "cfg.json: key 'attention_bias' must be true or false"},
       }) {
    nlohmann::json j = c.base;
    j[c.key] = c.value;
    EXPECT_ERROR_CONTAINS(models::config_from_hf(j, "cfg.json"), c.message);
  }
  EXPECT_ERROR_CONTAINS(models::config_from_hf(nlohmann::json::array({gpt2}), "cfg.json"),
                        "cfg.json: expected a JSON object, got [");
}

// A file where the model folder belongs and a directory where config.json belongs are named as such.
TEST(HfFormat, FileForTheFolderAndFolderForTheFileAreNamed) {
  TempDir dir;
  megaton::testing::write_bytes(dir.file("model"), "x");
  EXPECT_ERROR_CONTAINS(models::load_hf_model(dir.file("model")), "model '" + dir.file("model") + "' is a file");
  std::filesystem::create_directories(dir.file("folder/config.json"));
  EXPECT_ERROR_CONTAINS(models::load_hf_model(dir.file("folder")),
                        "model config '" + dir.file("folder/config.json") + "' is a directory");
}

// DeepSeek folders: what Megaton cannot express is refused naming the key; a stored copy of the
// embedding or head in an MTP layer that differs from the tensor it copies is refused by name; an
// absent copy is fine (Megaton shares them).
TEST(HfFormat, DeepSeekRefusalsNameTheKeyAndMtpCopiesMustMatch) {
  const nlohmann::json good = models::config_to_hf(megaton::testing::tiny_config("deepseek-v3-tiny"));
  auto refused = [&](const char* key, const nlohmann::json& value, const std::string& needle) {
    nlohmann::json j = good;
    j[key] = value;
    try {
      models::config_from_hf(j, "config.json");
      ADD_FAILURE() << key << " = " << value.dump() << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused("topk_method", "group_limited_greedy", "topk_method");
  refused("moe_layer_freq", 2, "moe_layer_freq");
  refused("kv_lora_rank", 0, "kv_lora_rank");
  refused("qk_rope_head_dim", 7, "qk_pos_emb_head_dim");
  refused("num_nextn_predict_layers", 99, "mtp_num_layers");
  refused("rope_scaling", nlohmann::json{{"type", "dynamic"}, {"factor", 2.0}}, "rope_scaling type");

  models::TransformerModel m(megaton::testing::tiny_config("deepseek-v3-tiny"));
  m.init_weights(3);
  auto tensors = models::to_hf_tensors(m);
  std::map<std::string, Tensor> map(tensors.begin(), tensors.end());
  const std::string copy = "model.layers." + std::to_string(m.config().num_layers) + ".embed_tokens.weight";
  ASSERT_TRUE(map.count(copy)) << "no MTP copy of the embedding written";
  models::TransformerModel back(m.config());
  auto without = map;
  without.erase(copy);
  EXPECT_NO_THROW(models::load_hf_tensors(back, without, "f.safetensors"));
  Tensor changed = map.at(copy).clone(MemCategory::Other);
  changed.data<float>()[5] += 1.0f;
  map[copy] = changed;
  EXPECT_ERROR_CONTAINS(models::load_hf_tensors(back, map, "f.safetensors"), "differs from the tensor it copies");
}
