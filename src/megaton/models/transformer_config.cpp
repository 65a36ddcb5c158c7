#include "megaton/models/transformer_config.h"

#include <algorithm>
#include <cmath>

#include "megaton/core/error.h"
#include "megaton/nn/block_spec.h"

namespace megaton::models {

void TransformerConfig::validate() const {
  // Upper bounds far above any real model, low enough that every size computed from them (tables,
  // weights, activations) fits in int64: a typo fails here, not as a wrapped allocation.
  auto positive = [](const char* key, int64_t v, int64_t max = int64_t{1} << 24) {
    if (v <= 0 || v > max) fail("model config: ", key, " must be in [1, ", max, "], got ", v);
  };
  auto finite_positive = [](const char* key, double v) {
    if (!(std::isfinite(v) && v > 0)) fail("model config: ", key, " must be a finite positive number, got ", v);
  };
  positive("num_layers", num_layers);
  positive("hidden_size", hidden_size);
  positive("num_attention_heads", num_attention_heads);
  positive("num_query_groups", num_query_groups);
  positive("ffn_hidden_size", ffn_hidden_size);
  positive("vocab_size", vocab_size, int64_t{1} << 31);  // token ids are int32
  positive("max_position_embeddings", max_position_embeddings);
  positive("make_vocab_size_divisible_by", make_vocab_size_divisible_by, int64_t{1} << 16);
  if (kv_channels < 0 || kv_channels > (int64_t{1} << 16))
    fail("model config: kv_channels must be in [0, 65536] (0: hidden_size / heads), got ", kv_channels);
  finite_positive("norm_epsilon", norm_epsilon);
  finite_positive("init_method_std", init_method_std);
  finite_positive("rotary_base", rotary_base);
  if (!std::isfinite(rope_scaling.factor) || !std::isfinite(rope_scaling.low_freq_factor) ||
      !std::isfinite(rope_scaling.high_freq_factor) || !std::isfinite(rope_scaling.original_max_position))
    fail("model config: rope_scaling values must be finite");
  if (kv_channels <= 0 && hidden_size % num_attention_heads != 0)
    fail("model config: hidden_size ", hidden_size, " is not divisible by num_attention_heads ",
         num_attention_heads, " (set kv_channels to choose the head dim explicitly)");
  if (num_attention_heads % num_query_groups != 0)
    fail("model config: num_attention_heads ", num_attention_heads, " is not divisible by num_query_groups ",
         num_query_groups);
  auto known_kind = [](const char* key, const std::string& kind, const std::vector<std::string>& kinds) {
    if (std::find(kinds.begin(), kinds.end(), kind) != kinds.end()) return;
    std::string known;
    for (const auto& k : kinds) known += (known.empty() ? "" : ", ") + k;
    fail("model config: unknown ", key, " '", kind, "' (known: ", known, ")");
  };
  known_kind("attention_type", attention_type, nn::attention_kinds());
  known_kind("mlp_type", mlp_type, nn::mlp_kinds());
  if (mlp_type == "moe") {
    moe.validate();
    if (first_k_dense_replace < 0 || first_k_dense_replace > num_layers)
      fail("model config: first_k_dense_replace must be in [0, num_layers = ", num_layers, "], got ",
           first_k_dense_replace);
  }
  if (position_embedding == PositionEmbedding::Rope && head_dim() % 2 != 0 && !is_mla())
    fail("model config: rotary embeddings need an even head dim, got ", head_dim());
  if (mtp_num_layers < 0 || mtp_num_layers > 16)
    fail("model config: mtp_num_layers must be in [0, 16], got ", mtp_num_layers);
  if (!(std::isfinite(mtp_loss_scaling_factor) && mtp_loss_scaling_factor >= 0))
    fail("model config: mtp_loss_scaling_factor must be finite and >= 0, got ", mtp_loss_scaling_factor);
  if (mtp_num_layers > 0 && position_embedding != PositionEmbedding::Rope)
    fail("model config: multi-token prediction needs position_embedding_type rope (mtp_num_layers ", mtp_num_layers,
         ")");
  if (is_mla()) {
    mla.validate();
    if (num_query_groups != num_attention_heads)
      fail("model config: attention_type mla has no kv groups: num_query_groups (", num_query_groups,
           ") must equal num_attention_heads (", num_attention_heads, ")");
    if (position_embedding != PositionEmbedding::Rope)
      fail("model config: attention_type mla needs position_embedding_type rope (its decoupled rotary key)");
  }
  if (rope_scaling.yarn && rope_scaling.factor > 0) {
    for (const double v : {rope_scaling.beta_fast, rope_scaling.beta_slow, rope_scaling.mscale,
                           rope_scaling.mscale_all_dim})
      if (!std::isfinite(v) || v < 0) fail("model config: YaRN rope_scaling values must be finite and >= 0, got ", v);
    if (!(rope_scaling.original_max_position > 0) || !(rope_scaling.beta_fast > 0) || !(rope_scaling.beta_slow > 0))
      fail("model config: YaRN needs positive beta_fast, beta_slow and original_max_position_embeddings");
  }
}

double TransformerConfig::softmax_scale() const {
  const double d = static_cast<double>(is_mla() ? mla.qk_dim() : head_dim());
  return kernels::rope_softmax_factor(rope_scaling) / std::sqrt(d);
}

int64_t TransformerConfig::padded_vocab_size(int64_t tp) const {
  const int64_t multiple = make_vocab_size_divisible_by * tp;  // both bounded: no overflow
  return (vocab_size + multiple - 1) / multiple * multiple;
}

namespace {
// Matmul parameters of one layer's MLP: the dense one, or an MoE's router, experts (all, or the k a
// token runs through) and shared expert.
int64_t mlp_matmul_params(const TransformerConfig& c, int64_t layer, bool active_only) {
  const int64_t C = c.hidden_size;
  if (!c.is_moe_layer(layer)) {
    const int64_t fc1_out = c.activation == Activation::SwiGLU ? 2 * c.ffn_hidden_size : c.ffn_hidden_size;
    return C * fc1_out + c.ffn_hidden_size * C;
  }
  const nn::MoeConfig& m = c.moe;
  const int64_t experts = active_only ? m.moe_router_topk : m.num_moe_experts;
  return C * m.num_moe_experts + experts * 3 * C * m.moe_ffn_hidden_size +
         3 * C * m.moe_shared_expert_intermediate_size;
}
}  // namespace

namespace {
// Weights (matmul = true: the GEMMs' only; else with norms and biases) of one layer's attention.
int64_t attention_params(const TransformerConfig& c, bool matmul) {
  const int64_t C = c.hidden_size, H = c.num_attention_heads, b = c.add_bias_linear && !matmul ? 1 : 0;
  const int64_t norm = matmul ? 0 : 1;
  if (!c.is_mla()) return C * c.qkv_size() + b * c.qkv_size() + H * c.head_dim() * C + b * C;
  const nn::MlaConfig& m = c.mla;
  const int64_t Q = m.q_lora_rank, R = m.kv_lora_rank, r = m.qk_pos_emb_head_dim;
  const int64_t q_out = H * m.qk_dim(), kv_out = H * (m.qk_head_dim + m.v_head_dim);
  const int64_t query = Q > 0 ? C * Q + b * Q + norm * Q + Q * q_out + b * q_out : C * q_out + b * q_out;
  return query + C * (R + r) + b * (R + r) + norm * R + R * kv_out + b * kv_out + H * m.v_head_dim * C + b * C;
}
}  // namespace

int64_t TransformerConfig::num_parameters(bool active_only) const {
  const int64_t C = hidden_size, F = ffn_hidden_size;
  const int64_t b = add_bias_linear ? 1 : 0;
  const int64_t norm = normalization == Normalization::LayerNorm ? 2 * C : C;
  const int64_t fc1_out = activation == Activation::SwiGLU ? 2 * F : F;
  const int64_t attn = norm + attention_params(*this, false) + norm;
  int64_t n = vocab_size * C + norm;
  // The decoder layers, then each MTP depth's block (a layer past the last) with its two input
  // norms, eh_proj and final norm.
  for (int64_t i = 0; i < num_layers + mtp_num_layers; ++i) {
    const int64_t layer = std::min(i, num_layers);
    n += attn + mlp_matmul_params(*this, layer, active_only);
    if (!is_moe_layer(layer)) n += b * fc1_out + b * C;
    else if (moe.moe_router_enable_expert_bias) n += moe.num_moe_experts;
    if (i >= num_layers) n += 2 * norm + 2 * C * C + norm;
  }
  if (position_embedding == PositionEmbedding::LearnedAbsolute) n += max_position_embeddings * C;
  if (!tie_embeddings) n += vocab_size * C;
  return n;
}

double TransformerConfig::flops_per_token(int64_t seq_len) const {
  const double C = static_cast<double>(hidden_size);
  const double qk = static_cast<double>(is_mla() ? mla.qk_dim() : head_dim());
  const double v = static_cast<double>(is_mla() ? mla.v_head_dim : head_dim());
  double matmul_params = static_cast<double>(vocab_size) * C;
  // Each MTP depth runs a layer past the last, its eh_proj and the head once more.
  for (int64_t i = 0; i < num_layers + mtp_num_layers; ++i)
    matmul_params += static_cast<double>(attention_params(*this, true)) +
                     static_cast<double>(mlp_matmul_params(*this, std::min(i, num_layers), true)) +
                     (i >= num_layers ? 2.0 * C * C + static_cast<double>(vocab_size) * C : 0.0);
  // Scores (qk) and the weighted values (v), 2 FLOPs per multiply-add, x3 for backward, causal half.
  const double attention = 6.0 * static_cast<double>(num_layers + mtp_num_layers) * num_attention_heads * (qk + v) *
                           seq_len / 2.0;
  return 6.0 * matmul_params + attention;
}

namespace {
TransformerConfig gpt2_shape(const char* name, int64_t layers, int64_t hidden, int64_t heads) {
  TransformerConfig c;
  c.name = name;
  c.num_layers = layers;
  c.hidden_size = hidden;
  c.num_attention_heads = c.num_query_groups = heads;
  c.ffn_hidden_size = 4 * hidden;
  c.vocab_size = 50257;
  c.max_position_embeddings = 1024;
  return c;
}

TransformerConfig llama_shape(const char* name, int64_t layers, int64_t hidden, int64_t heads, int64_t groups,
                              int64_t ffn) {
  TransformerConfig c;
  c.name = name;
  c.num_layers = layers;
  c.hidden_size = hidden;
  c.num_attention_heads = heads;
  c.num_query_groups = groups;
  c.ffn_hidden_size = ffn;
  c.vocab_size = 128256;
  c.max_position_embeddings = 131072;
  c.normalization = Normalization::RMSNorm;
  c.activation = Activation::SwiGLU;
  c.position_embedding = PositionEmbedding::Rope;
  c.rotary_base = 500000.0;
  c.rope_scaling = {32.0, 1.0, 4.0, 8192.0};
  c.add_bias_linear = false;
  c.tie_embeddings = false;
  return c;
}
}  // namespace

namespace {
// DeepSeek's models: multi-latent attention, the first layers dense, the rest mixtures of experts with
// shared experts; the published shapes from their HF config.json, and a tiny one of the V3 kind.
TransformerConfig deepseek(const std::string& name) {
  TransformerConfig c = llama_shape(name.c_str(), 4, 192, 6, 6, 512);
  c.attention_type = "mla";
  c.mlp_type = "moe";
  c.rope_layout = kernels::RopeLayout::Interleaved;  // DeepSeek's checkpoints pair dims 2i, 2i + 1
  c.rotary_base = 10000.0;
  c.norm_epsilon = 1e-6;
  nn::MoeConfig& m = c.moe;
  // V3: sigmoid scores, the top 4 of 8 groups, normalised top-k weights scaled by 2.5, bias-based
  // balancing plus a small sequence-wise auxiliary loss.
  m.moe_router_score_function = "sigmoid";
  m.moe_router_pre_softmax = false;
  m.moe_router_norm_topk_prob = true;
  m.moe_router_enable_expert_bias = true;
  m.moe_router_load_balancing_type = "seq_aux_loss";
  m.moe_aux_loss_coeff = 1e-4;
  const kernels::RopeScaling yarn{40.0, 1.0, 4.0, 4096.0, true, 32.0, 1.0, 1.0, 1.0};
  if (name == "deepseek-v3-tiny") {
    c.vocab_size = 257;
    c.max_position_embeddings = 256;
    c.rope_scaling = {};
    c.first_k_dense_replace = 1;
    c.mla = {48, 32, 16, 8, 16};
    m.num_moe_experts = 8;
    m.moe_router_topk = 2;
    m.moe_router_num_groups = 4;
    m.moe_router_group_topk = 2;
    m.moe_ffn_hidden_size = 64;
    m.moe_shared_expert_intermediate_size = 64;
    m.moe_router_topk_scaling_factor = 2.5;
    c.mtp_num_layers = 1;
    return c;
  }
  c.rope_scaling = yarn;
  c.max_position_embeddings = 163840;
  if (name == "deepseek-v3-671b") {
    c.num_layers = 61;
    c.hidden_size = 7168;
    c.num_attention_heads = c.num_query_groups = 128;
    c.ffn_hidden_size = 18432;
    c.vocab_size = 129280;
    c.first_k_dense_replace = 3;
    c.mla = {1536, 512, 128, 64, 128};
    m.num_moe_experts = 256;
    m.moe_router_topk = 8;
    m.moe_router_num_groups = 8;
    m.moe_router_group_topk = 4;
    m.moe_ffn_hidden_size = 2048;
    m.moe_shared_expert_intermediate_size = 2048;
    m.moe_router_topk_scaling_factor = 2.5;
    c.mtp_num_layers = 1;
    return c;
  }
  // V2-Lite: no query latent, softmax over all 64 experts then the top 6, unnormalised, 2 shared experts.
  c.num_layers = 27;
  c.hidden_size = 2048;
  c.num_attention_heads = c.num_query_groups = 16;
  c.ffn_hidden_size = 10944;
  c.vocab_size = 102400;
  c.first_k_dense_replace = 1;
  c.mla = {0, 512, 128, 64, 128};
  c.rope_scaling.mscale = c.rope_scaling.mscale_all_dim = 0.707;
  m.num_moe_experts = 64;
  m.moe_router_topk = 6;
  m.moe_router_score_function = "softmax";
  m.moe_router_pre_softmax = true;
  m.moe_router_norm_topk_prob = false;
  m.moe_router_enable_expert_bias = false;
  m.moe_aux_loss_coeff = 1e-3;
  m.moe_ffn_hidden_size = 1408;
  m.moe_shared_expert_intermediate_size = 2 * 1408;
  return c;
}
}  // namespace

TransformerConfig preset(const std::string& name) {
  if (name == "gpt-tiny") {
    // The demo and test model: byte vocabulary, small enough to train in minutes on 2 cores.
    TransformerConfig c = gpt2_shape("gpt-tiny", 4, 192, 6);
    c.vocab_size = 257;
    c.max_position_embeddings = 256;
    return c;
  }
  if (name == "gpt2-124m") return gpt2_shape("gpt2-124m", 12, 768, 12);
  if (name == "gpt2-350m") return gpt2_shape("gpt2-350m", 24, 1024, 16);
  if (name == "llama-tiny") {
    TransformerConfig c = llama_shape("llama-tiny", 4, 192, 6, 2, 512);
    c.vocab_size = 257;
    c.max_position_embeddings = 256;
    c.rotary_base = 10000.0;
    c.rope_scaling = {};
    return c;
  }
  if (name == "llama3-1b") {
    TransformerConfig c = llama_shape("llama3-1b", 16, 2048, 32, 8, 8192);
    c.tie_embeddings = true;
    return c;
  }
  if (name == "llama3-8b") return llama_shape("llama3-8b", 32, 4096, 32, 8, 14336);
  if (name == "mixtral-tiny" || name == "mixtral-8x7b") {
    // Mixtral: a Llama whose every MLP is 8 SwiGLU experts, top-2 by a softmax over the selected
    // logits (HF's softmax -> top-k -> renormalise), with the Switch balancing loss.
    const bool tiny = name == "mixtral-tiny";
    TransformerConfig c = tiny ? llama_shape("mixtral-tiny", 4, 192, 6, 2, 256) : llama_shape("mixtral-8x7b", 32, 4096, 32, 8, 14336);
    c.vocab_size = tiny ? 257 : 32000;
    c.max_position_embeddings = tiny ? 256 : 32768;
    c.rotary_base = 1e6;
    c.rope_scaling = {};
    c.mlp_type = "moe";
    c.moe.num_moe_experts = 8;
    c.moe.moe_router_topk = 2;
    c.moe.moe_ffn_hidden_size = c.ffn_hidden_size;
    c.moe.moe_router_pre_softmax = false;
    c.moe.moe_router_load_balancing_type = "aux_loss";
    c.moe.moe_aux_loss_coeff = 0.02;  // Mixtral's router_aux_loss_coef
    return c;
  }
  if (name == "deepseek-v3-tiny" || name == "deepseek-v3-671b" || name == "deepseek-v2-lite") return deepseek(name);
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  fail("unknown model preset '", name, "' (known: ", known, ")");
}

std::vector<std::string> preset_names() {
  return {"gpt-tiny",     "gpt2-124m",    "gpt2-350m",        "llama-tiny",       "llama3-1b",       "llama3-8b",
          "mixtral-tiny", "mixtral-8x7b", "deepseek-v3-tiny", "deepseek-v2-lite", "deepseek-v3-671b"};
}

namespace {
template <typename E, size_t N>
E enum_from_name(const char* what, const std::string& s, const std::pair<const char*, E> (&table)[N]) {
  std::string known;
  for (const auto& [name, value] : table) {
    if (s == name) return value;
    known += (known.empty() ? "" : ", ") + std::string(name);
  }
  fail("unknown ", what, " '", s, "' (expected one of ", known, ")");
}
template <typename E, size_t N>
std::string enum_name(E v, const std::pair<const char*, E> (&table)[N]) {
  for (const auto& [name, value] : table)
    if (value == v) return name;
  return "?";
}
constexpr std::pair<const char*, Normalization> kNorms[] = {{"LayerNorm", Normalization::LayerNorm},
                                                            {"RMSNorm", Normalization::RMSNorm}};
constexpr std::pair<const char*, Activation> kActs[] = {{"gelu", Activation::GeLU}, {"swiglu", Activation::SwiGLU}};
constexpr std::pair<const char*, PositionEmbedding> kPos[] = {{"learned_absolute", PositionEmbedding::LearnedAbsolute},
                                                              {"rope", PositionEmbedding::Rope}};
constexpr std::pair<const char*, kernels::RopeLayout> kRope[] = {{"half", kernels::RopeLayout::Half},
                                                                 {"interleaved", kernels::RopeLayout::Interleaved}};
}  // namespace

std::string normalization_name(Normalization n) { return enum_name(n, kNorms); }
std::string activation_name(Activation a) { return enum_name(a, kActs); }
std::string position_embedding_name(PositionEmbedding p) { return enum_name(p, kPos); }
Normalization normalization_from_name(const std::string& s) { return enum_from_name("normalization", s, kNorms); }
Activation activation_from_name(const std::string& s) { return enum_from_name("activation", s, kActs); }
PositionEmbedding position_embedding_from_name(const std::string& s) {
  return enum_from_name("position_embedding_type", s, kPos);
}
kernels::RopeLayout rope_layout_from_name(const std::string& s) { return enum_from_name("rope_layout", s, kRope); }

}  // namespace megaton::models
