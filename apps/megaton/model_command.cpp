// `megaton model info`: a model's shape, parameter counts (all, and those one token runs through)
// and training FLOPs per token, from a preset or an HF folder's config.json, without building it
// (the 671B preset's counts need no memory).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "megaton/core/error.h"
#include "megaton/models/hf_format.h"
#include "megaton/models/transformer_config.h"
#include "option_range.h"

namespace megaton::app {

namespace {

nlohmann::json model_info(const models::TransformerConfig& c, int64_t seq_len) {
  nlohmann::json j = {{"name", c.name},
                      {"num_layers", c.num_layers},
                      {"hidden_size", c.hidden_size},
                      {"num_attention_heads", c.num_attention_heads},
                      {"attention_type", c.attention_type},
                      {"mlp_type", c.mlp_type},
                      {"vocab_size", c.vocab_size},
                      {"parameters", c.num_parameters()},
                      {"active_parameters", c.num_parameters(true)},
                      {"seq_length", seq_len},
                      {"train_flops_per_token", c.flops_per_token(seq_len)}};
  if (c.is_mla())
    j["mla"] = {{"q_lora_rank", c.mla.q_lora_rank},
                {"kv_lora_rank", c.mla.kv_lora_rank},
                {"qk_head_dim", c.mla.qk_head_dim},
                {"qk_pos_emb_head_dim", c.mla.qk_pos_emb_head_dim},
                {"v_head_dim", c.mla.v_head_dim},
                // Decoding caches per token and layer: the latent (MLA) instead of every head's k and v.
                {"kv_cache_values_per_token_layer", c.mla.kv_lora_rank + c.mla.qk_pos_emb_head_dim}};
  else
    j["kv_cache_values_per_token_layer"] = 2 * c.num_query_groups * c.head_dim();
  if (c.mlp_type == "moe")
    j["moe"] = {{"num_moe_experts", c.moe.num_moe_experts},
                {"moe_router_topk", c.moe.moe_router_topk},
                {"moe_ffn_hidden_size", c.moe.moe_ffn_hidden_size},
                {"moe_shared_expert_intermediate_size", c.moe.moe_shared_expert_intermediate_size},
                {"first_k_dense_replace", c.first_k_dense_replace}};
  return j;
}

// 671000000000 -> "671.0B".
std::string human(double n) {
  const char* units[] = {"", "K", "M", "B", "T"};
  int u = 0;
  while (n >= 1000.0 && u < 4) {
    n /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%s", n, units[u]);
  return buf;
}

}  // namespace

void add_model_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("model", "Describe a model");
  auto* info = cmd->add_subcommand("info", "Shape, parameter counts (total and per token) and training FLOPs per token "
                                           "of a preset or an HF model folder");
  static std::string preset, model_dir;
  static int64_t seq_len = 4096;
  static bool json_out = false;
  info->add_option("--preset", preset, "A model preset (" + [] {
    std::string names;
    for (const auto& n : models::preset_names()) names += (names.empty() ? "" : ", ") + n;
    return names;
  }() + ")");
  info->add_option("--model", model_dir, "An HF model folder (its config.json only is read)");
  info->add_option("--seq-len", seq_len, "Sequence length for the attention FLOPs")
      ->capture_default_str()
      ->check(in_range<int64_t>(1, int64_t{1} << 24));
  info->add_flag("--json", json_out, "Print one JSON object");
  cmd->require_subcommand(1);
  info->callback([] {
    if (preset.empty() == model_dir.empty()) fail("model info: give exactly one of --preset and --model");
    const models::TransformerConfig c = preset.empty() ? models::load_hf_config(model_dir) : models::preset(preset);
    const nlohmann::json j = model_info(c, seq_len);
    if (json_out) {
      std::printf("%s\n", j.dump().c_str());
      return;
    }
    std::printf("%s: %lld layers, hidden %lld, %lld heads, %s attention, %s MLP, vocabulary %lld\n", c.name.c_str(),
                static_cast<long long>(c.num_layers), static_cast<long long>(c.hidden_size),
                static_cast<long long>(c.num_attention_heads), c.attention_type.c_str(), c.mlp_type.c_str(),
                static_cast<long long>(c.vocab_size));
    std::printf("parameters: %s total, %s per token\n", human(double(c.num_parameters())).c_str(),
                human(double(c.num_parameters(true))).c_str());
    std::printf("training FLOPs per token at sequence length %lld: %s\n", static_cast<long long>(seq_len),
                human(c.flops_per_token(seq_len)).c_str());
    for (const auto& [key, value] : j.items())
      if (value.is_object()) std::printf("%s: %s\n", key.c_str(), value.dump().c_str());
  });
}

}  // namespace megaton::app
