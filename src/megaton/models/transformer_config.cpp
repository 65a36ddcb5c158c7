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
  if (position_embedding == PositionEmbedding::Rope && head_dim() % 2 != 0)
    fail("model config: rotary embeddings need an even head dim, got ", head_dim());
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

int64_t TransformerConfig::num_parameters() const {
  const int64_t C = hidden_size, D = head_dim(), Hq = num_attention_heads, F = ffn_hidden_size;
  const int64_t b = add_bias_linear ? 1 : 0;
  const int64_t norm = normalization == Normalization::LayerNorm ? 2 * C : C;
  const int64_t fc1_out = activation == Activation::SwiGLU ? 2 * F : F;
  const int64_t attn = norm + C * qkv_size() + b * qkv_size() + Hq * D * C + b * C + norm;
  int64_t n = vocab_size * C + norm;
  for (int64_t i = 0; i < num_layers; ++i) {
    n += attn + mlp_matmul_params(*this, i, false);
    if (!is_moe_layer(i)) n += b * fc1_out + b * C;
    else if (moe.moe_router_enable_expert_bias) n += moe.num_moe_experts;
  }
  if (position_embedding == PositionEmbedding::LearnedAbsolute) n += max_position_embeddings * C;
  if (!tie_embeddings) n += vocab_size * C;
  return n;
}

double TransformerConfig::flops_per_token(int64_t seq_len) const {
  const double C = static_cast<double>(hidden_size), D = static_cast<double>(head_dim());
  double matmul_params = static_cast<double>(vocab_size) * C;
  for (int64_t i = 0; i < num_layers; ++i)
    matmul_params += C * static_cast<double>(qkv_size()) + static_cast<double>(num_attention_heads) * D * C +
                     static_cast<double>(mlp_matmul_params(*this, i, true));
  const double attention = 12.0 * num_layers * num_attention_heads * D * seq_len / 2.0;
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
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  fail("unknown model preset '", name, "' (known: ", known, ")");
}

std::vector<std::string> preset_names() {
  return {"gpt-tiny", "gpt2-124m", "gpt2-350m", "llama-tiny", "llama3-1b", "llama3-8b", "mixtral-tiny", "mixtral-8x7b"};
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
