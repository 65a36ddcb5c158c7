#include "megaton/models/hf_format.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <set>
#include <type_traits>

#include "megaton/ckpt/safetensors.h"
#include "megaton/core/atomic_file.h"
#include "megaton/core/regular_file.h"
#include "megaton/kernels/cpu/element.h"
#include "megaton/models/hf_quantized.h"

namespace megaton::models {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// `value` for an error message: its JSON text, cut short.
std::string shown(const json& value) {
  std::string text = value.dump();
  return text.size() > 40 ? text.substr(0, 37) + "..." : text;
}

// The value of `key` read strictly as T (an integer must be a JSON integer, not 12.0 or true; a
// bool must be true or false), or nullopt when absent or null. Errors name source and key.
template <typename T>
std::optional<T> read(const json& j, const std::string& key, const std::string& source) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  const json& v = *it;
  auto wrong = [&](const char* want) {
    fail(source, ": key '", key, "' must be ", want, ", got ", shown(v), " (", v.type_name(), ")");
  };
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) wrong("true or false");
  } else if constexpr (std::is_same_v<T, int64_t>) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail(source, ": key '", key, "' = ", shown(v), " is out of range (at most ", INT64_MAX, ")");
    if (!v.is_number_integer()) wrong("an integer");
  } else if constexpr (std::is_same_v<T, double>) {
    if (!v.is_number()) wrong("a number");
  } else {
    if (!v.is_string()) wrong("a string");
  }
  return v.get<T>();
}

template <typename T>
T get_or(const json& j, const std::string& key, T fallback, const std::string& source) {
  return read<T>(j, key, source).value_or(fallback);
}

template <typename T>
T require(const json& j, const std::string& key, const std::string& source) {
  if (auto v = read<T>(j, key, source)) return *v;
  fail(source, ": missing key '", key, "'");
}

// MixtralForCausalLM's MoE keys: every layer's MLP is num_local_experts SwiGLU experts of
// intermediate_size, top-num_experts_per_tok by a softmax over the selected logits (HF's softmax ->
// top-k -> renormalise is that), the Switch balancing loss weighted by router_aux_loss_coef when HF
// would train with it (output_router_logits).
void read_mixtral_moe(TransformerConfig& c, const json& j, const std::string& source) {
  c.mlp_type = "moe";
  c.moe.num_moe_experts = require<int64_t>(j, "num_local_experts", source);
  c.moe.moe_router_topk = require<int64_t>(j, "num_experts_per_tok", source);
  c.moe.moe_ffn_hidden_size = c.ffn_hidden_size;
  c.moe.moe_router_pre_softmax = false;
  c.moe.moe_router_load_balancing_type = "aux_loss";
  c.moe.moe_aux_loss_coeff =
      get_or<bool>(j, "output_router_logits", false, source) ? get_or<double>(j, "router_aux_loss_coef", 0.001, source) : 0.0;
  if (const auto window = get_or<int64_t>(j, "sliding_window", 0, source); window > 0 && window < c.max_position_embeddings)
    fail(source, ": sliding_window ", window, " < max_position_embeddings ", c.max_position_embeddings,
         ": sliding-window attention is not supported");
  if (get_or<double>(j, "router_jitter_noise", 0.0, source) != 0.0)
    fail(source, ": router_jitter_noise is not supported (it must be 0)");
}

// DeepseekV2ForCausalLM / DeepseekV3ForCausalLM keys: multi-latent attention, YaRN, the first
// first_k_dense_replace layers dense and the rest MoE with shared experts. V3 routes by sigmoid scores
// plus e_score_correction_bias ("noaux_tc": group-limited, a group scored by its top-2) and scales the
// normalised weights by routed_scaling_factor; V2 "greedy" by a softmax over every expert.
void read_deepseek(TransformerConfig& c, const json& j, const std::string& source, bool v3) {
  c.attention_type = "mla";
  c.num_query_groups = c.num_attention_heads;
  c.kv_channels = 0;
  c.rope_layout = kernels::RopeLayout::Interleaved;  // DeepSeek's q / k rope rows pair 2i with 2i + 1
  c.mla.q_lora_rank = get_or<int64_t>(j, "q_lora_rank", 0, source);
  c.mla.kv_lora_rank = require<int64_t>(j, "kv_lora_rank", source);
  c.mla.qk_head_dim = require<int64_t>(j, "qk_nope_head_dim", source);
  c.mla.qk_pos_emb_head_dim = require<int64_t>(j, "qk_rope_head_dim", source);
  c.mla.v_head_dim = require<int64_t>(j, "v_head_dim", source);
  c.mtp_num_layers = get_or<int64_t>(j, "num_nextn_predict_layers", 0, source);
  const auto routed = read<int64_t>(j, "n_routed_experts", source);
  if (!routed) return;  // every layer dense
  if (get_or<int64_t>(j, "moe_layer_freq", 1, source) != 1)
    fail(source, ": moe_layer_freq other than 1 is not supported");
  nn::MoeConfig& m = c.moe;
  c.mlp_type = "moe";
  c.first_k_dense_replace = get_or<int64_t>(j, "first_k_dense_replace", 0, source);
  m.num_moe_experts = *routed;
  m.moe_router_topk = require<int64_t>(j, "num_experts_per_tok", source);
  m.moe_ffn_hidden_size = require<int64_t>(j, "moe_intermediate_size", source);
  m.moe_shared_expert_intermediate_size = get_or<int64_t>(j, "n_shared_experts", 0, source) * m.moe_ffn_hidden_size;
  m.moe_router_score_function = get_or<std::string>(j, "scoring_func", "softmax", source);
  m.moe_router_norm_topk_prob = get_or<bool>(j, "norm_topk_prob", false, source);
  m.moe_router_topk_scaling_factor = get_or<double>(j, "routed_scaling_factor", 1.0, source);
  const auto method = get_or<std::string>(j, "topk_method", v3 ? "noaux_tc" : "greedy", source);
  if (method == "noaux_tc") {
    m.moe_router_enable_expert_bias = true;
    m.moe_router_num_groups = get_or<int64_t>(j, "n_group", 1, source);
    m.moe_router_group_topk = get_or<int64_t>(j, "topk_group", 1, source);
    m.moe_router_pre_softmax = false;
  } else if (method == "greedy") {
    m.moe_router_pre_softmax = true;
    // V2 scales the weights only when it does not normalise them.
    if (!v3 && m.moe_router_norm_topk_prob) m.moe_router_topk_scaling_factor = 1.0;
  } else {
    fail(source, ": topk_method '", method, "' is not supported (noaux_tc or greedy)");
  }
  m.moe_aux_loss_coeff = get_or<double>(j, "aux_loss_alpha", 0.0, source);
  m.moe_router_load_balancing_type = get_or<bool>(j, "seq_aux", true, source) ? "seq_aux_loss" : "aux_loss";
}

void read_yarn(TransformerConfig& c, const json& s, const std::string& where) {
  kernels::RopeScaling& r = c.rope_scaling;
  r.yarn = true;
  r.factor = require<double>(s, "factor", where);
  r.original_max_position = get_or<double>(s, "original_max_position_embeddings", 4096.0, where);
  r.beta_fast = get_or<double>(s, "beta_fast", 32.0, where);
  r.beta_slow = get_or<double>(s, "beta_slow", 1.0, where);
  r.mscale = get_or<double>(s, "mscale", 1.0, where);
  r.mscale_all_dim = get_or<double>(s, "mscale_all_dim", 0.0, where);
}

}  // namespace

bool is_mixtral_shaped(const TransformerConfig& c) {
  const nn::MoeConfig& m = c.moe;
  return c.mlp_type == "moe" && c.first_k_dense_replace == 0 && m.moe_shared_expert_intermediate_size == 0 &&
         !m.sigmoid() && !m.moe_router_pre_softmax && m.moe_router_num_groups == 1 && !m.moe_router_enable_expert_bias &&
         m.moe_router_topk_scaling_factor == 1.0 && m.moe_z_loss_coeff == 0.0 && m.moe_expert_capacity_factor == 0.0 &&
         (m.moe_router_load_balancing_type == "aux_loss" || m.moe_aux_loss_coeff == 0.0);
}

TransformerConfig config_from_hf(const json& j, const std::string& source) {
  if (!j.is_object()) fail(source, ": expected a JSON object, got ", shown(j), " (", j.type_name(), ")");
  const std::string type = require<std::string>(j, "model_type", source);
  TransformerConfig c;
  c.name = "custom";
  if (type == "gpt2") {
    c.vocab_size = require<int64_t>(j, "vocab_size", source);
    c.max_position_embeddings = require<int64_t>(j, "n_positions", source);
    c.hidden_size = require<int64_t>(j, "n_embd", source);
    c.num_layers = require<int64_t>(j, "n_layer", source);
    c.num_attention_heads = c.num_query_groups = require<int64_t>(j, "n_head", source);
    c.ffn_hidden_size = get_or<int64_t>(j, "n_inner", 4 * c.hidden_size, source);
    c.norm_epsilon = get_or<double>(j, "layer_norm_epsilon", 1e-5, source);
    c.tie_embeddings = get_or<bool>(j, "tie_word_embeddings", true, source);
    const auto act = get_or<std::string>(j, "activation_function", "gelu_new", source);
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
      fail(source, ": activation_function '", act, "' is not supported (Megaton's GPT-2 uses tanh GeLU, gelu_new)");
  } else if (type == "llama" || type == "mixtral" || type == "deepseek_v2" || type == "deepseek_v3") {
    const bool deepseek = type.starts_with("deepseek");
    c.vocab_size = require<int64_t>(j, "vocab_size", source);
    c.hidden_size = require<int64_t>(j, "hidden_size", source);
    c.ffn_hidden_size = require<int64_t>(j, "intermediate_size", source);
    c.num_layers = require<int64_t>(j, "num_hidden_layers", source);
    c.num_attention_heads = require<int64_t>(j, "num_attention_heads", source);
    c.num_query_groups = get_or<int64_t>(j, "num_key_value_heads", c.num_attention_heads, source);
    c.kv_channels = get_or<int64_t>(j, "head_dim", 0, source);
    c.max_position_embeddings = get_or<int64_t>(j, "max_position_embeddings", 2048, source);
    c.norm_epsilon = get_or<double>(j, "rms_norm_eps", 1e-6, source);
    c.rotary_base = get_or<double>(j, "rope_theta", 10000.0, source);
    c.tie_embeddings = get_or<bool>(j, "tie_word_embeddings", false, source);
    c.normalization = Normalization::RMSNorm;
    c.activation = Activation::SwiGLU;
    c.position_embedding = PositionEmbedding::Rope;
    c.rope_layout = kernels::RopeLayout::Half;
    c.add_bias_linear = false;
    if (get_or<bool>(j, "attention_bias", false, source) || get_or<bool>(j, "mlp_bias", false, source))
      fail(source, ": attention_bias / mlp_bias are not supported for llama models");
    if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
      if (!it->is_object()) fail(source, ": key 'rope_scaling' must be an object, got ", shown(*it));
      const std::string where = source + " rope_scaling";
      const auto rt = get_or<std::string>(*it, "rope_type", get_or<std::string>(*it, "type", "", where), where);
      if (rt == "yarn" && deepseek) {
        read_yarn(c, *it, where);
      } else {
        if (rt != "llama3")
          fail(source, ": rope_scaling type '", rt, "' is not supported (llama3; yarn for deepseek models)");
        c.rope_scaling.factor = require<double>(*it, "factor", where);
        c.rope_scaling.low_freq_factor = get_or<double>(*it, "low_freq_factor", 1.0, where);
        c.rope_scaling.high_freq_factor = get_or<double>(*it, "high_freq_factor", 4.0, where);
        c.rope_scaling.original_max_position = get_or<double>(*it, "original_max_position_embeddings", 8192.0, where);
      }
    }
    if (type == "mixtral") read_mixtral_moe(c, j, source);
    if (deepseek) read_deepseek(c, j, source, type == "deepseek_v3");
  } else {
    fail(source, ": model_type '", type,
         "' is not supported (expected gpt2, llama, mixtral, deepseek_v2 or deepseek_v3)");
  }
  c.validate();
  return c;
}

namespace {
// The DeepseekV2 / V3 config.json of an MLA model (config_to_hf's Llama keys in `j` already).
void write_deepseek(json& j, const TransformerConfig& c) {
  const nn::MlaConfig& a = c.mla;
  const nn::MoeConfig& m = c.moe;
  const bool moe = c.mlp_type == "moe";
  // V3's router (sigmoid + selection bias) or V2's greedy softmax one; other routers have no HF form.
  const bool v3 = !moe || (m.sigmoid() && m.moe_router_enable_expert_bias);
  const bool v2 = moe && !m.sigmoid() && m.moe_router_pre_softmax && m.moe_router_num_groups == 1 &&
                  !m.moe_router_enable_expert_bias && (!m.moe_router_norm_topk_prob || m.moe_router_topk_scaling_factor == 1.0);
  if (moe && !(v3 || v2))
    fail("model '", c.name, "': its router has no DeepSeek HF form (V3: sigmoid scores with the expert bias; V2: "
         "softmax over every expert, one group)");
  if (moe && (m.moe_shared_expert_intermediate_size % m.moe_ffn_hidden_size != 0 || m.moe_z_loss_coeff != 0.0 ||
              m.moe_expert_capacity_factor != 0.0))
    fail("model '", c.name, "': shared experts of a multiple of moe_ffn_hidden_size, no z-loss and dropless routing "
         "are what DeepSeek's HF format holds");
  j["model_type"] = v3 ? "deepseek_v3" : "deepseek_v2";
  j["architectures"] = {v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"};
  j["num_key_value_heads"] = c.num_attention_heads;
  j.erase("head_dim");
  j.erase("mlp_bias");
  j["q_lora_rank"] = a.q_lora_rank > 0 ? json(a.q_lora_rank) : json(nullptr);
  j["kv_lora_rank"] = a.kv_lora_rank;
  j["qk_nope_head_dim"] = a.qk_head_dim;
  j["qk_rope_head_dim"] = a.qk_pos_emb_head_dim;
  j["v_head_dim"] = a.v_head_dim;
  j["num_nextn_predict_layers"] = c.mtp_num_layers;
  j["n_routed_experts"] = nullptr;
  if (!moe) return;
  j["n_routed_experts"] = m.num_moe_experts;
  j["num_experts_per_tok"] = m.moe_router_topk;
  j["moe_intermediate_size"] = m.moe_ffn_hidden_size;
  j["n_shared_experts"] = m.moe_shared_expert_intermediate_size / m.moe_ffn_hidden_size;
  j["moe_layer_freq"] = 1;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["scoring_func"] = m.moe_router_score_function;
  j["topk_method"] = v3 ? "noaux_tc" : "greedy";
  j["n_group"] = m.moe_router_num_groups;
  j["topk_group"] = m.moe_router_group_topk;
  j["norm_topk_prob"] = m.moe_router_norm_topk_prob;
  j["routed_scaling_factor"] = m.moe_router_topk_scaling_factor;
  j["aux_loss_alpha"] = m.moe_aux_loss_coeff;
  j["seq_aux"] = m.moe_router_load_balancing_type == "seq_aux_loss";
}
}  // namespace

json config_to_hf(const TransformerConfig& c) {
  if ((c.attention_type != "self_attention" && c.attention_type != "mla") ||
      (c.mlp_type != "dense" && c.mlp_type != "moe"))
    fail("model '", c.name, "' has attention_type '", c.attention_type, "' and mlp_type '", c.mlp_type,
         "'; the HF formats (GPT-2, Llama) need self_attention and dense");
  if (c.mlp_type == "moe" && c.position_embedding != PositionEmbedding::Rope)
    fail("model '", c.name, "' has MoE layers but learned positions; no HF format fits it");
  const bool gpt2 = c.position_embedding == PositionEmbedding::LearnedAbsolute;
  if (gpt2) {
    if (c.normalization != Normalization::LayerNorm || c.activation != Activation::GeLU || !c.add_bias_linear ||
        c.num_query_groups != c.num_attention_heads || c.head_dim() * c.num_attention_heads != c.hidden_size)
      fail("model '", c.name, "' has learned positions but is not GPT-2 shaped; no HF format fits it");
    return {{"model_type", "gpt2"},
            {"architectures", {"GPT2LMHeadModel"}},
            {"vocab_size", c.vocab_size},
            {"n_positions", c.max_position_embeddings},
            {"n_ctx", c.max_position_embeddings},
            {"n_embd", c.hidden_size},
            {"n_layer", c.num_layers},
            {"n_head", c.num_attention_heads},
            {"n_inner", c.ffn_hidden_size},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", c.norm_epsilon},
            {"tie_word_embeddings", c.tie_embeddings},
            {"torch_dtype", "float32"}};
  }
  if (c.normalization != Normalization::RMSNorm || c.activation != Activation::SwiGLU || c.add_bias_linear)
    fail("model '", c.name, "' uses rotary positions but is not Llama shaped; no HF format fits it");
  json j = {{"model_type", "llama"},
            {"architectures", {"LlamaForCausalLM"}},
            {"vocab_size", c.vocab_size},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.ffn_hidden_size},
            {"num_hidden_layers", c.num_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.num_query_groups},
            {"head_dim", c.head_dim()},
            {"max_position_embeddings", c.max_position_embeddings},
            {"rms_norm_eps", c.norm_epsilon},
            {"rope_theta", c.rotary_base},
            {"tie_word_embeddings", c.tie_embeddings},
            {"hidden_act", "silu"},
            {"attention_bias", false},
            {"mlp_bias", false},
            {"torch_dtype", "float32"},
            {"rope_scaling", nullptr}};
  if (c.is_mla()) {
    if (c.rope_layout != kernels::RopeLayout::Interleaved)
      fail("model '", c.name, "': DeepSeek's HF format holds interleaved rotary dims (rope_layout interleaved)");
    write_deepseek(j, c);
  } else if (is_mixtral_shaped(c)) {
    const nn::MoeConfig& m = c.moe;
    j["model_type"] = "mixtral";
    j["architectures"] = {"MixtralForCausalLM"};
    j["intermediate_size"] = m.moe_ffn_hidden_size;
    j["num_local_experts"] = m.num_moe_experts;
    j["num_experts_per_tok"] = m.moe_router_topk;
    j["output_router_logits"] = m.moe_aux_loss_coeff > 0;
    j["router_aux_loss_coef"] = m.moe_aux_loss_coeff;
    j["sliding_window"] = nullptr;
    j.erase("attention_bias");
    j.erase("mlp_bias");
  } else if (c.mlp_type == "moe") {
    // A Llama with DeepSeek-V3's MoE layers and config keys. No HF class reads this combination
    // (DeepseekV3ForCausalLM also needs MLA), so the model_type names Megaton's own, which
    // `load_hf_config` refuses; the tensor names are DeepSeek-V3's.
    const nn::MoeConfig& m = c.moe;
    j["model_type"] = "megaton_llama_moe";
    j["architectures"] = json::array();
    j["n_routed_experts"] = m.num_moe_experts;
    j["num_experts_per_tok"] = m.moe_router_topk;
    j["moe_intermediate_size"] = m.moe_ffn_hidden_size;
    j["shared_expert_intermediate_size"] = m.moe_shared_expert_intermediate_size;
    j["scoring_func"] = m.moe_router_score_function;
    j["n_group"] = m.moe_router_num_groups;
    j["topk_group"] = m.moe_router_group_topk;
    j["norm_topk_prob"] = m.moe_router_norm_topk_prob;
    j["routed_scaling_factor"] = m.moe_router_topk_scaling_factor;
    j["first_k_dense_replace"] = c.first_k_dense_replace;
  }
  if (c.rope_scaling.factor > 0 && c.rope_scaling.yarn)
    j["rope_scaling"] = {{"type", "yarn"},
                         {"factor", c.rope_scaling.factor},
                         {"original_max_position_embeddings", c.rope_scaling.original_max_position},
                         {"beta_fast", c.rope_scaling.beta_fast},
                         {"beta_slow", c.rope_scaling.beta_slow},
                         {"mscale", c.rope_scaling.mscale},
                         {"mscale_all_dim", c.rope_scaling.mscale_all_dim}};
  else if (c.rope_scaling.factor > 0)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_scaling.factor},
                         {"low_freq_factor", c.rope_scaling.low_freq_factor},
                         {"high_freq_factor", c.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", c.rope_scaling.original_max_position}};
  return j;
}

namespace {

// One HF tensor = a block of rows [row0, row0 + rows) of one Megaton parameter, possibly
// transposed (GPT-2's Conv1D) or with each head's rows permuted between Megaton's interleaved
// RoPE layout and HF's rotate_half layout (rope_head_dim > 0). For linear_qkv (qkv set) the rows
// are those of HF's stacked [all q | all k | all v], each moved to its row in Megaton's
// per-query-group layout.
struct Binding {
  std::string hf_name;
  nn::Parameter* param;
  int64_t row0 = 0, rows = -1;
  bool transpose = false;
  int64_t rope_head_dim = 0;
  std::optional<nn::AttentionShape> qkv = std::nullopt;
  // A copy of a tensor bound elsewhere (DeepSeek-V3's MTP layers store the embedding and head
  // again): written on save, left out of gradient dumps, and on load optional but, when present,
  // required to equal the tensor it copies.
  bool copy = false;
};

// An MoE layer under DeepSeek-V3's names: the router "gate" (+ e_score_correction_bias, the
// selection-only bias), each routed expert's gate / up / down projections as rows of the stacked
// grouped weights, and the shared expert. Mixtral's: block_sparse_moe.gate and experts.E.w1 (gate),
// w3 (up), w2 (down).
void moe_bindings(std::vector<Binding>& out, const std::string& p, nn::MoeLayer& moe, int64_t C, bool mixtral) {
  const int64_t F = moe.config().moe_ffn_hidden_size;
  if (mixtral) {
    out.push_back({p + "block_sparse_moe.gate.weight", &moe.router.weight});
    for (int64_t e = 0; e < moe.config().num_moe_experts; ++e) {
      const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
      out.push_back({x + "w1.weight", &moe.fc1, 2 * F * e, F});
      out.push_back({x + "w3.weight", &moe.fc1, 2 * F * e + F, F});
      out.push_back({x + "w2.weight", &moe.fc2, C * e, C});
    }
    return;
  }
  out.push_back({p + "mlp.gate.weight", &moe.router.weight});
  if (moe.expert_bias.value.defined()) out.push_back({p + "mlp.gate.e_score_correction_bias", &moe.expert_bias});
  for (int64_t e = 0; e < moe.config().num_moe_experts; ++e) {
    const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
    out.push_back({x + "gate_proj.weight", &moe.fc1, 2 * F * e, F});
    out.push_back({x + "up_proj.weight", &moe.fc1, 2 * F * e + F, F});
    out.push_back({x + "down_proj.weight", &moe.fc2, C * e, C});
  }
  if (moe.shared) {
    const int64_t S = moe.config().moe_shared_expert_intermediate_size;
    out.push_back({p + "mlp.shared_experts.gate_proj.weight", &moe.shared->fc1.weight, 0, S});
    out.push_back({p + "mlp.shared_experts.up_proj.weight", &moe.shared->fc1.weight, S, S});
    out.push_back({p + "mlp.shared_experts.down_proj.weight", &moe.shared->fc2.weight});
  }
}

// Multi-latent attention under DeepSeek's names, every tensor whole (the rotary rows are in the
// interleaved order Megaton uses).
void mla_bindings(std::vector<Binding>& out, const std::string& p, nn::MultiLatentAttention& a) {
  const std::string s = p + "self_attn.";
  if (a.q_proj) {
    out.push_back({s + "q_proj.weight", &a.q_proj->weight});
  } else {
    out.push_back({s + "q_a_proj.weight", &a.q_down->weight});
    out.push_back({s + "q_a_layernorm.weight", &a.q_norm->weight});
    out.push_back({s + "q_b_proj.weight", &a.q_up->weight});
  }
  out.push_back({s + "kv_a_proj_with_mqa.weight", &a.kv_down.weight});
  out.push_back({s + "kv_a_layernorm.weight", &a.kv_norm.weight});
  out.push_back({s + "kv_b_proj.weight", &a.kv_up.weight});
  out.push_back({s + "o_proj.weight", &a.proj.weight});
}

std::vector<Binding> bindings(TransformerModel& m) {
  const TransformerConfig& c = m.config();
  if (m.tensor_parallel().active() || m.expert_parallel().active())
    fail("the HF format holds whole tensors: gather the model's ", m.tensor_parallel().size(), " tensor-parallel x ",
         m.expert_parallel().size(), " expert-parallel shards first");
  const int64_t V = c.vocab_size;  // the embedding's and head's rows past it are padding
  std::vector<Binding> out;
  const bool gpt2 = c.position_embedding == PositionEmbedding::LearnedAbsolute;
  const nn::AttentionShape attn{c.hidden_size, c.num_attention_heads, c.num_query_groups, c.head_dim()};
  if (gpt2) {
    out.push_back({"transformer.wte.weight", &m.embedding().word, 0, V});
    out.push_back({"transformer.wpe.weight", &m.embedding().position});
    for (size_t i = 0; i < m.layers().size(); ++i) {
      auto& l = *m.layers()[i];
      const std::string p = "transformer.h." + std::to_string(i) + ".";
      out.push_back({p + "ln_1.weight", &l.input_norm.weight});
      out.push_back({p + "ln_1.bias", &l.input_norm.bias});
      out.push_back({p + "attn.c_attn.weight", &l.self_attention().qkv.weight, 0, -1, true, 0, attn});
      out.push_back({p + "attn.c_attn.bias", &l.self_attention().qkv.bias, 0, -1, false, 0, attn});
      out.push_back({p + "attn.c_proj.weight", &l.self_attention().proj.weight, 0, -1, true});
      out.push_back({p + "attn.c_proj.bias", &l.self_attention().proj.bias});
      out.push_back({p + "ln_2.weight", &l.pre_mlp_norm.weight});
      out.push_back({p + "ln_2.bias", &l.pre_mlp_norm.bias});
      out.push_back({p + "mlp.c_fc.weight", &l.dense_mlp().fc1.weight, 0, -1, true});
      out.push_back({p + "mlp.c_fc.bias", &l.dense_mlp().fc1.bias});
      out.push_back({p + "mlp.c_proj.weight", &l.dense_mlp().fc2.weight, 0, -1, true});
      out.push_back({p + "mlp.c_proj.bias", &l.dense_mlp().fc2.bias});
    }
    out.push_back({"transformer.ln_f.weight", &m.final_norm().weight});
    out.push_back({"transformer.ln_f.bias", &m.final_norm().bias});
  } else {
    const int64_t D = c.head_dim(), q = c.num_attention_heads * D, kv = c.num_query_groups * D;
    const int64_t F = c.ffn_hidden_size;
    const int64_t rope = c.rope_layout == kernels::RopeLayout::Interleaved ? D : 0;
    out.push_back({"model.embed_tokens.weight", &m.embedding().word, 0, V});
    // A decoder layer (or an MTP depth's block) under Llama's / DeepSeek's names.
    auto layer = [&](nn::TransformerBlock& l, const std::string& p, bool moe) {
      out.push_back({p + "input_layernorm.weight", &l.input_norm.weight});
      if (c.is_mla()) {
        mla_bindings(out, p, l.latent_attention());
      } else {
        out.push_back({p + "self_attn.q_proj.weight", &l.self_attention().qkv.weight, 0, q, false, rope, attn});
        out.push_back({p + "self_attn.k_proj.weight", &l.self_attention().qkv.weight, q, kv, false, rope, attn});
        out.push_back({p + "self_attn.v_proj.weight", &l.self_attention().qkv.weight, q + kv, kv, false, 0, attn});
        out.push_back({p + "self_attn.o_proj.weight", &l.self_attention().proj.weight});
      }
      out.push_back({p + "post_attention_layernorm.weight", &l.pre_mlp_norm.weight});
      if (moe) {
        moe_bindings(out, p, dynamic_cast<nn::MoeLayer&>(*l.mlp), c.hidden_size, is_mixtral_shaped(c));
        return;
      }
      out.push_back({p + "mlp.gate_proj.weight", &l.dense_mlp().fc1.weight, 0, F});
      out.push_back({p + "mlp.up_proj.weight", &l.dense_mlp().fc1.weight, F, F});
      out.push_back({p + "mlp.down_proj.weight", &l.dense_mlp().fc2.weight});
    };
    const auto L = static_cast<int64_t>(m.layers().size());
    for (int64_t i = 0; i < L; ++i)
      layer(*m.layers()[static_cast<size_t>(i)], "model.layers." + std::to_string(i) + ".", c.is_moe_layer(i));
    // DeepSeek-V3 stores MTP depth k as layer L + k, with its own copies of the embedding and head.
    for (size_t k = 0; k < m.mtp_layers().size(); ++k) {
      nn::MtpLayer& d = *m.mtp_layers()[k];
      const std::string p = "model.layers." + std::to_string(L + static_cast<int64_t>(k)) + ".";
      out.push_back({p + "enorm.weight", &d.enorm.weight});
      out.push_back({p + "hnorm.weight", &d.hnorm.weight});
      out.push_back({p + "eh_proj.weight", &d.eh_proj.weight});
      layer(d.block, p, c.is_moe_layer(L));
      out.push_back({p + "shared_head.norm.weight", &d.final_norm.weight});
      out.push_back({p + "embed_tokens.weight", &m.embedding().word, 0, V, false, 0, std::nullopt, true});
      out.push_back({p + "shared_head.head.weight", &m.output_weight(), 0, V, false, 0, std::nullopt, true});
    }
    out.push_back({"model.norm.weight", &m.final_norm().weight});
  }
  if (!c.tie_embeddings) out.push_back({"lm_head.weight", &m.output_weight(), 0, V});
  return out;
}

// Megaton row index (within one head) that HF's rotate_half row `hf_row` comes from: HF row
// s*D/2 + i holds interleaved row 2i + s (the permutation HF's Llama conversion applies).
int64_t interleaved_row(int64_t hf_row, int64_t D) {
  const int64_t half = D / 2;
  return 2 * (hf_row % half) + hf_row / half;
}

int64_t cols_of(const Tensor& t) { return t.dim() == 1 ? 1 : t.size(1); }

Shape hf_shape(const Binding& b, const Tensor& full) {
  const int64_t rows = b.rows < 0 ? full.size(0) : b.rows;
  if (full.dim() == 1) return {rows};
  return b.transpose ? Shape{full.size(1), rows} : Shape{rows, full.size(1)};
}

// Megaton source row for HF row r of binding b.
int64_t source_row(const Binding& b, int64_t r) {
  const int64_t D = b.rope_head_dim;
  const int64_t row = D == 0 ? b.row0 + r : b.row0 + (r / D) * D + interleaved_row(r % D, D);
  return b.qkv ? b.qkv->fused_row(row) : row;
}

// Binding b's HF tensor (f32) out of `full`, the parameter's value or gradient.
Tensor hf_tensor(const Binding& b, const Tensor& full) {
  const int64_t cols = cols_of(full);
  Tensor t = Tensor::empty(hf_shape(b, full), DType::F32, MemCategory::Workspace, b.hf_name);
  const float* src = full.data<float>();
  float* dst = t.data<float>();
  const int64_t rows = t.dim() == 1 ? t.size(0) : (b.transpose ? t.size(1) : t.size(0));
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + source_row(b, r) * cols;
    for (int64_t k = 0; k < cols; ++k) (b.transpose ? dst[k * rows + r] : dst[r * cols + k]) = s[k];
  }
  return t;
}

// A parameter's codes and scales in Megaton's layout, gathered from the stored tensors bound to its
// rows. Each row keeps the scales of the stored block it came from (block_rows 1), so fused weights
// (q / k / v, gate / up) whose parts have their own blocks, and RoPE's row permutation, need no
// re-quantisation; once assembled, rows that still share their scales in bands of the stored block
// height are given one scale row per band again (kernels::with_row_bands).
struct RowAssembly {
  kernels::QuantizedWeight w;
  int64_t rows_filled = 0;
  bool codes_in_place = false;  // w.codes is a view of the mapped file (file_span): only scales to gather
  int64_t out_block = 0;        // the stored blocks' height along Megaton's output rows; 1 if parts differ
};

void assemble_rows(RowAssembly& a, const Binding& b, const StoredQuantized& s, kernels::WeightQuant q,
                   const std::string& source) {
  const Tensor& full = b.param->value;
  const int64_t out = full.size(0), in = full.size(1);
  const int64_t block = b.transpose ? s.block_rows : s.block_cols;  // along Megaton's input dimension
  const int64_t scale_cols = (in + block - 1) / block;
  if (!a.w.scale_inv.defined()) {
    Tensor codes = a.codes_in_place
                       ? a.w.codes
                       : Tensor::empty({out, in}, s.codes.dtype(), MemCategory::Params, b.param->name + ".codes");
    a.w = {q, std::move(codes),
           Tensor::empty({out, scale_cols}, DType::F32, MemCategory::Params, b.param->name + ".scale_inv"), 1, block};
  } else if (a.w.block_cols != block) {
    fail(source, ": tensor '", b.hf_name, "' has blocks of ", block, " along its input, the other parts of ",
         b.param->name, " ", a.w.block_cols);
  }
  const int64_t out_block = b.transpose ? s.block_cols : s.block_rows;
  a.out_block = a.out_block == 0 || a.out_block == out_block ? out_block : 1;
  const int64_t rows = b.transpose ? s.codes.size(1) : s.codes.size(0);
  const auto* src = static_cast<const uint8_t*>(s.codes.raw());
  auto* codes = static_cast<uint8_t*>(a.w.codes.raw());
  float* scales = a.w.scale_inv.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t pr = source_row(b, r);
    if (!a.codes_in_place)
      for (int64_t k = 0; k < in; ++k) codes[pr * in + k] = b.transpose ? src[k * rows + r] : src[r * in + k];
    for (int64_t kb = 0; kb < scale_cols; ++kb)
      scales[pr * scale_cols + kb] = b.transpose ? s.scale(kb * block, r) : s.scale(r, kb * block);
  }
  a.rows_filled += rows;
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> to_hf_tensors(TransformerModel& model, bool gradients) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const Binding& b : bindings(model)) {
    if (b.copy && gradients) continue;
    out.emplace_back(b.hf_name, hf_tensor(b, gradients ? b.param->grad : b.param->value));
  }
  return out;
}

namespace {

// HF tensors by name, each read when asked: from a map in memory, or mapped from a safetensors file
// one tensor at a time (so loading a folder never holds a copy of it beside the model).
class HfTensors {
 public:
  virtual ~HfTensors() = default;
  virtual bool has(const std::string& name) const = 0;
  virtual Tensor get(const std::string& name) const = 0;
  virtual DType dtype(const std::string& name) const = 0;
  virtual std::vector<std::string> names() const = 0;
  // The mapped file that get()'s borrowed tensors view, to make views spanning several of them.
  virtual std::shared_ptr<const void> mapping() const { return nullptr; }
};

class MapTensors final : public HfTensors {
 public:
  explicit MapTensors(const std::map<std::string, Tensor>& m) : m_(m) {}
  bool has(const std::string& name) const override { return m_.count(name) > 0; }
  Tensor get(const std::string& name) const override { return m_.at(name); }
  DType dtype(const std::string& name) const override { return m_.at(name).dtype(); }
  std::vector<std::string> names() const override {
    std::vector<std::string> n;
    for (const auto& [name, t] : m_) n.push_back(name);
    return n;
  }

 private:
  const std::map<std::string, Tensor>& m_;
};

class FileTensors final : public HfTensors {
 public:
  explicit FileTensors(const std::string& path) : reader_(path) {}
  bool has(const std::string& name) const override { return reader_.has(name); }
  Tensor get(const std::string& name) const override { return reader_.map(name, MemCategory::Workspace); }
  DType dtype(const std::string& name) const override { return reader_.dtype(name); }
  std::vector<std::string> names() const override { return reader_.names(); }
  std::shared_ptr<const void> mapping() const override { return reader_.mapping(); }

 private:
  ckpt::SafetensorsReader reader_;
};

// The HF name binding b's tensor is stored under: GPT2Model checkpoints use bare names ("h.0.ln_1.weight",
// "wte.weight").
std::string stored_name(const HfTensors& tensors, const Binding& b) {
  const std::string& key = b.hf_name;
  if (!tensors.has(key) && key.starts_with("transformer.") && tensors.has(key.substr(12))) return key.substr(12);
  return key;
}

// Parameter p's whole value as one view of the mapped file, when the tensors bound to it (`bound`)
// lie there in f32, bf16 or as 8-bit codes, untransposed, in p's row order and back to back, starting on a cache line
// (Llama's o_proj, down_proj and embedding; gate_proj and up_proj where the writer put them in that
// order, as Megaton and HF's name-sorted writers do); else undefined. Shapes are checked by the caller.
Tensor file_span(const nn::Parameter& p, const std::vector<const Binding*>& bound, const HfTensors& tensors) {
  if (bound.empty() || p.value.dim() > 2) return {};
  const int64_t cols = cols_of(p.value);
  int64_t rows = 0;
  uintptr_t base = 0;
  DType dtype = DType::F32;
  for (const Binding* b : bound) {
    const std::string key = stored_name(tensors, *b);
    if (!tensors.has(key)) return {};  // the caller names it
    const Tensor t = tensors.get(key);
    if (b->transpose || !t.borrowed() || t.shape() != hf_shape(*b, p.value)) return {};
    if (rows == 0) dtype = t.dtype();
    if (t.dtype() != dtype) return {};
    const int64_t n = t.size(0), first = source_row(*b, 0);
    for (int64_t r = 1; r < n; ++r)
      if (source_row(*b, r) != first + r) return {};
    // Where row 0 of p lies if this tensor's rows are in place: the same for every bound tensor.
    const uintptr_t row0 =
        reinterpret_cast<uintptr_t>(t.raw()) - static_cast<uintptr_t>(first * cols) * dtype_size(dtype);
    if (rows > 0 && row0 != base) return {};
    base = row0;
    rows += n;
  }
  std::shared_ptr<const void> mapping = tensors.mapping();  // made by the first get()
  // Off a cache line every vector load of a GEMV splits in two: a 110M decode measured ~15% slower
  // from such a view than from a copy (HF's writer aligns the data to 8 bytes, Megaton's to 64).
  if (rows != p.value.size(0) || !mapping || base % 64 != 0) return {};
  return Tensor::borrowed(std::move(mapping), reinterpret_cast<void*>(base), p.value.shape(), dtype,
                          MemCategory::Params, p.name);
}

// Writes `rows` rows of `src` (f32; [cols, rows] when transposed) into full's rows source_row(b, r), in
// full's dtype (f32, or bf16 rounded to nearest even); a copy binding compares them instead.
template <typename D>
void write_rows(const Binding& b, const Tensor& src_tensor, D* dst, int64_t rows, int64_t cols, const std::string& key,
                const std::string& source) {
  const float* src = src_tensor.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    D* d = dst + source_row(b, r) * cols;
    for (int64_t k = 0; k < cols; ++k) {
      const D v = kernels::cpu::store<D>(b.transpose ? src[k * rows + r] : src[r * cols + k]);
      if (!b.copy)
        d[k] = v;
      else if (kernels::cpu::load(d[k]) !=
               kernels::cpu::load(v))  // compared, never written: the value may be a view of the file
        fail(source, ": tensor '", key, "' differs from the tensor it copies (", b.param->name,
             "): Megaton shares one embedding and head between the model and its MTP layers");
    }
  }
}

// How load_tensors holds the weights of a model built to serve (load_hf_folder's ServeWeights).
struct Holding {
  // A parameter whose bytes lie in the mapped file as file_span finds them, in the dtype it is held
  // in, becomes a view of it instead of a copy (training's optimizer would write into copy-on-write pages).
  bool share_file = false;
  std::set<const nn::Parameter*> bf16;  // held in bf16 alone: bf16 views of the file, or rounded as they load
  bool codes = false;                   // a weight whose every tensor is stored quantised is held as its codes alone
};

// Whether every tensor bound to a parameter is stored as 8-bit codes.
bool stored_quantised(const HfTensors& tensors, const std::vector<const Binding*>& bound) {
  return std::all_of(bound.begin(), bound.end(), [&](const Binding* b) {
    const std::string key = stored_name(tensors, *b);
    return tensors.has(key) && (tensors.dtype(key) == DType::I8 || tensors.dtype(key) == DType::F8E4M3);
  });
}

TransformerModel::StoredQuantizedWeights load_tensors(TransformerModel& model, const HfTensors& tensors,
                                                      const std::string& source,
                                                      std::optional<kernels::WeightQuant> quantization,
                                                      const Holding& holding = {}) {
  // Buffers some GPT-2 / Llama exports carry that are not parameters.
  auto ignorable = [](const std::string& n) {
    auto ends = [&](const char* s) { return n.size() >= std::strlen(s) && n.ends_with(s); };
    return ends(".attn.bias") || ends(".attn.masked_bias") || ends("rotary_emb.inv_freq");
  };
  std::set<std::string> used;
  const bool tied = model.config().tie_embeddings;
  // Copies last: they are compared with the tensors they copy, which must be loaded by then.
  std::vector<Binding> all = bindings(model);
  std::stable_partition(all.begin(), all.end(), [](const Binding& b) { return !b.copy; });
  std::map<nn::Parameter*, RowAssembly> assembled;
  TransformerModel::StoredQuantizedWeights quantized;
  std::map<nn::Parameter*, std::vector<const Binding*>> bound;
  for (const Binding& b : all)
    if (!b.copy) bound[b.param].push_back(&b);
  std::set<const nn::Parameter*> shared;  // values that are views of the file: nothing to copy
  std::set<const nn::Parameter*> as_codes;  // values that become their codes: nothing to widen
  for (nn::Parameter* p : model.parameters()) {
    const auto it = bound.find(p);
    // Its f32 allocation stays untouched, so never backed, until the codes replace it.
    if (holding.codes && it != bound.end() && stored_quantised(tensors, it->second)) {
      as_codes.insert(p);
      if (Tensor codes = holding.share_file ? file_span(*p, it->second, tensors) : Tensor(); codes.defined()) {
        assembled[p].w.codes = std::move(codes);
        assembled[p].codes_in_place = true;
      }
      continue;
    }
    const DType held = holding.bf16.count(p) ? DType::BF16 : DType::F32;
    Tensor span = holding.share_file && it != bound.end() ? file_span(*p, it->second, tensors) : Tensor();
    if (span.defined() && span.dtype() == held) {
      p->value = std::move(span);
      shared.insert(p);
      continue;
    }
    // Replaces the (untouched, so never backed) f32 allocation.
    if (held != DType::F32) p->value = Tensor::empty(p->value.shape(), held, MemCategory::Params, p->name);
    // A value built uncleared (nn::UnclearedValues) must have every row written: rows no tensor is
    // bound to (a padded vocabulary's, or a parameter HF does not store) are zero.
    int64_t rows = 0;
    if (it != bound.end())
      for (const Binding* b : it->second) rows += hf_shape(*b, p->value)[b->transpose ? 1 : 0];
    if (rows != (p->value.dim() == 0 ? 1 : p->value.size(0))) p->value.zero_();
  }
  for (const Binding& b : all) {
    const std::string key = stored_name(tensors, b);
    if (!tensors.has(key) && b.copy) continue;
    if (!tensors.has(key)) fail(source, ": missing tensor '", b.hf_name, "'");
    used.insert(key);
    const Tensor stored_tensor = tensors.get(key);
    Tensor full = b.param->value;
    const Shape want = hf_shape(b, full);
    if (stored_tensor.shape() != want)
      fail(source, ": tensor '", key, "' has shape ", shape_str(stored_tensor.shape()), ", expected ", shape_str(want));
    if (shared.count(b.param) && !b.copy) continue;
    Tensor t;
    if (const DType stored = stored_tensor.dtype(); stored == DType::I8 || stored == DType::F8E4M3) {
      if (!quantization)
        fail(source, ": tensor '", key, "' is stored as ", dtype_name(stored),
             " but config.json has no quantization_config saying how to scale it");
      const std::string scale_key = scale_inv_name(key);
      if (!tensors.has(scale_key)) fail(source, ": tensor '", key, "' is quantised but '", scale_key, "' is missing");
      used.insert(scale_key);
      const StoredQuantized q =
          check_stored(stored_tensor, tensors.get(scale_key), *quantization, b.transpose, key, source);
      if (!b.copy) assemble_rows(assembled[b.param], b, q, *quantization, source);
      if (as_codes.count(b.param)) {
        if (!b.copy) continue;
        // A copy of a weight held as codes: compared in the values both stand for.
        full = kernels::dequantize_weight(assembled.at(b.param).w);
      }
      t = dequantize_stored(q);
    } else {
      t = stored == DType::F32 ? stored_tensor : stored_tensor.to(DType::F32, MemCategory::Workspace);
    }
    const int64_t cols = cols_of(full);
    const int64_t rows = want.size() == 1 ? want[0] : (b.transpose ? want[1] : want[0]);
    if (full.dtype() == DType::BF16)
      write_rows(b, t, full.data<BFloat16>(), rows, cols, key, source);
    else
      write_rows(b, t, full.data<float>(), rows, cols, key, source);
  }
  for (const std::string& name : tensors.names()) {
    if (used.count(name) || ignorable(name)) continue;
    // A tied model may still carry a copy of the head; it must equal the embedding.
    if (tied && name == "lm_head.weight") continue;
    fail(source, ": unexpected tensor '", name, "' for a ", model.config().num_layers, "-layer ",
         model.config().position_embedding == PositionEmbedding::Rope ? "llama" : "gpt2", " model");
  }
  for (auto& [param, a] : assembled) {
    if (a.rows_filled != param->value.size(0))
      fail(source, ": ", param->name, " is stored partly quantised (", a.rows_filled, " of its ", param->value.size(0),
           " rows): all of a weight's tensors must be quantised, or none");
    if (as_codes.count(param)) param->value = a.w.codes;  // the same storage as the codes the kernels read
    quantized.emplace(
        param, std::make_shared<const kernels::QuantizedWeight>(kernels::with_row_bands(std::move(a.w), a.out_block)));
  }
  return quantized;
}

}  // namespace

TransformerModel::StoredQuantizedWeights load_hf_tensors(TransformerModel& model,
                                                         const std::map<std::string, Tensor>& tensors,
                                                         const std::string& source,
                                                         std::optional<kernels::WeightQuant> quantization) {
  return load_tensors(model, MapTensors(tensors), source, quantization);
}

namespace {
// DIR/config.json parsed, and its path for messages.
std::pair<json, std::string> read_hf_config(const std::string& dir) {
  std::string path = (fs::path(dir) / "config.json").string();
  if (fs::exists(dir) && !fs::is_directory(dir))
    fail("model '", dir, "' is a file; expected an HF model folder (config.json + model.safetensors)");
  if (fs::is_directory(path)) fail("model config '", path, "' is a directory; expected the JSON file");
  if (!fs::exists(path)) fail("cannot open model config '", path, "' (is '", dir, "' an HF model folder?)");
  try {
    return {json::parse(read_regular_file(path, "model config")), path};
  } catch (const json::exception& e) {
    fail(path, ": invalid JSON: ", e.what());
  }
}
}  // namespace

TransformerConfig load_hf_config(const std::string& dir) {
  const auto [j, path] = read_hf_config(dir);
  return config_from_hf(j, path);
}

HfFolder load_hf_folder(const std::string& dir, bool gradients, ServeWeights serve) {
  if (serve.dtype != DType::F32 && serve.dtype != DType::BF16)
    fail("load_hf_folder: weights are served in f32 or bf16, not ", dtype_name(serve.dtype));
  if (gradients && (serve.dtype != DType::F32 || serve.codes))
    fail("load_hf_folder: weights held in bf16 or as codes alone are for a model without gradients (serving)");
  const std::string path = (fs::path(dir) / "model.safetensors").string();
  // A training checkpoint has config.json too, but its weights are in shard files.
  if (!fs::exists(path) && fs::exists(fs::path(dir) / "metadata.json"))
    fail("'", dir, "' is a sharded training checkpoint, not an HF model folder; write one from it with `megaton "
         "convert --input ", dir, " --output DIR`");
  const auto [j, config_path] = read_hf_config(dir);
  HfFolder f;
  {
    const nn::UnclearedValues loaded_next;  // load_tensors writes or maps every weight
    std::optional<nn::NoGradients> no_gradients;
    if (!gradients) no_gradients.emplace();
    f.model = std::make_unique<TransformerModel>(config_from_hf(j, config_path));
  }
  f.quantization = stored_quantization(j, config_path);
  Holding holding{.share_file = !gradients, .bf16 = {}, .codes = serve.codes};
  if (serve.dtype == DType::BF16)
    for (nn::Parameter* p : f.model->gemm_weights()) holding.bf16.insert(p);
  const FileTensors tensors(path);
  // A quantised folder's tied head is quantised from the embedding at install and read as those codes
  // from then on; the table itself is only looked up, which reads bf16 rows into f32 activations. So
  // an fp32 run holds it as the file stores it in bf16 (a view of the file) rather than widening it
  // (llama3-1b: 1.05 GB).
  nn::Parameter& word = f.model->embedding().word;
  if (serve.codes && f.quantization && f.model->config().tie_embeddings)
    for (const Binding& b : bindings(*f.model))
      if (b.param == &word && !b.copy && tensors.has(stored_name(tensors, b)) &&
          tensors.dtype(stored_name(tensors, b)) == DType::BF16)
        holding.bf16.insert(&word);
  f.quantized = load_tensors(*f.model, tensors, path, f.quantization, holding);
  return f;
}

std::unique_ptr<TransformerModel> load_hf_model(const std::string& dir) { return load_hf_folder(dir).model; }

void save_hf_model(TransformerModel& model, const std::string& dir, DType dtype,
                   std::optional<kernels::WeightQuant> quantization) {
  MEGATON_CHECK(dtype == DType::F32 || dtype == DType::BF16, "HF model folders are written in f32 or bf16, not ",
                dtype_name(dtype));
  std::set<const nn::Parameter*> quantized;
  if (quantization)
    for (nn::Parameter* p : model.quantizable_weights())  // a tied head is the embedding: stored as it is
      if (!(model.config().tie_embeddings && p == &model.output_weight())) quantized.insert(p);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const Binding& b : bindings(model)) {
    Tensor t = hf_tensor(b, b.param->value);
    if (quantized.count(b.param)) {
      StoredQuantized q = quantize_stored(t, *quantization, b.transpose);
      tensors.emplace_back(b.hf_name, std::move(q.codes));
      tensors.emplace_back(scale_inv_name(b.hf_name), std::move(q.scale_inv));
      continue;
    }
    tensors.emplace_back(b.hf_name, dtype == DType::F32 ? std::move(t) : t.to(dtype, MemCategory::Workspace));
  }
  fs::create_directories(dir);
  ckpt::save_safetensors((fs::path(dir) / "model.safetensors").string(), tensors,
                         {{"format", "pt"}, {"producer", "megaton"}});
  save_hf_config(model.config(), dir, dtype, quantization);
}

void save_hf_config(const TransformerConfig& c, const std::string& dir, DType dtype,
                    std::optional<kernels::WeightQuant> quantization) {
  nlohmann::json config = config_to_hf(c);
  if (dtype == DType::BF16) config["torch_dtype"] = "bfloat16";
  if (quantization) config["quantization_config"] = quantization_config(*quantization);
  write_file_atomically((fs::path(dir) / "config.json").string(), config.dump(2) + "\n");
}

}  // namespace megaton::models
