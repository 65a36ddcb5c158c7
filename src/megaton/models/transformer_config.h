// One TransformerConfig describes every decoder-only model Megaton builds (GPT-2, Llama, ...).
// Field names follow Megatron-LM's arguments; presets give the common shapes by name.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "megaton/kernels/rope.h"
#include "megaton/nn/layer_kinds.h"
#include "megaton/nn/mla_config.h"
#include "megaton/nn/moe/moe_config.h"

namespace megaton::models {

using nn::Activation;
using nn::Normalization;
enum class PositionEmbedding { LearnedAbsolute, Rope };

struct TransformerConfig {
  std::string name = "custom";          // preset name or "custom"
  int64_t num_layers = 2;
  int64_t hidden_size = 64;
  int64_t num_attention_heads = 4;
  int64_t num_query_groups = 4;         // kv heads (GQA); == heads for MHA
  int64_t kv_channels = 0;              // head dim; 0 -> hidden_size / heads
  int64_t ffn_hidden_size = 256;
  int64_t vocab_size = 257;
  // Megatron's make_vocab_size_divisible_by: the embedding and output layer hold the vocabulary
  // padded to a multiple of this x tensor_model_parallel_size (padding rows are never predicted and
  // not exported). 1 keeps an unsplit model exactly vocab_size rows.
  int64_t make_vocab_size_divisible_by = 1;
  int64_t max_position_embeddings = 256;
  // The block's sublayer kinds (nn/block_spec.h: Megatron's ModuleSpec idea).
  std::string attention_type = "self_attention";
  std::string mlp_type = "dense";
  // With attention_type "mla": the latent ranks and head parts (nn/mla_config.h); num_query_groups
  // and kv_channels do not apply, the rotary tables have qk_pos_emb_head_dim.
  nn::MlaConfig mla;
  // With mlp_type "moe": the experts (nn/moe/moe_config.h), and how many first layers keep a dense
  // MLP (DeepSeek-V3's first_k_dense_replace).
  nn::MoeConfig moe;
  int64_t first_k_dense_replace = 0;
  // Multi-token prediction (DeepSeek-V3; Megatron's names): depths after the main model, each
  // predicting one token further ahead; their mean loss weighted by mtp_loss_scaling_factor joins the
  // training loss (HF's num_nextn_predict_layers).
  int64_t mtp_num_layers = 0;
  double mtp_loss_scaling_factor = 0.1;
  Normalization normalization = Normalization::LayerNorm;
  Activation activation = Activation::GeLU;
  PositionEmbedding position_embedding = PositionEmbedding::LearnedAbsolute;
  kernels::RopeLayout rope_layout = kernels::RopeLayout::Half;
  double rotary_base = 10000.0;
  kernels::RopeScaling rope_scaling;    // factor 0: none
  bool add_bias_linear = true;          // biases on every linear (GPT-2) or none (Llama)
  bool tie_embeddings = true;           // output head shares the word embedding
  double norm_epsilon = 1e-5;
  double init_method_std = 0.02;

  int64_t head_dim() const { return kv_channels > 0 ? kv_channels : hidden_size / num_attention_heads; }
  bool is_mla() const { return attention_type == "mla"; }
  // The dimension the rotary tables rotate: a head, or MLA's rotary part.
  int64_t rope_dim() const { return is_mla() ? mla.qk_pos_emb_head_dim : head_dim(); }
  // The attention's softmax scale: 1 / sqrt(query head size), times YaRN's factor.
  double softmax_scale() const;
  int64_t qkv_size() const { return (num_attention_heads + 2 * num_query_groups) * head_dim(); }
  // vocab_size rounded up to a multiple of make_vocab_size_divisible_by x tp.
  int64_t padded_vocab_size(int64_t tp) const;
  // Throws megaton::Error naming the inconsistent fields (heads vs hidden, groups vs heads, ...).
  void validate() const;
  // Every parameter (all experts of an MoE layer), or with active_only those a token runs through
  // (an MoE layer's router, its top-k routed experts and its shared experts).
  int64_t num_parameters(bool active_only = false) const;
  // True when layer i has the MoE MLP.
  bool is_moe_layer(int64_t i) const { return mlp_type == "moe" && i >= first_k_dense_replace; }
  // Training FLOPs per token: 6 x (matmul parameters; an MoE layer's router, k routed and the shared experts) + attention (12 x layers x seq x
  // heads x head_dim, halved for the causal mask), the convention of Megatron / PaLM's MFU.
  double flops_per_token(int64_t seq_len) const;
};

// Named presets: gpt-tiny, gpt2-124m, gpt2-350m, llama-tiny, llama3-1b, llama3-8b, mixtral-tiny,
// mixtral-8x7b, deepseek-v3-tiny, deepseek-v2-lite, deepseek-v3-671b.
TransformerConfig preset(const std::string& name);
std::vector<std::string> preset_names();

std::string normalization_name(Normalization n);
std::string activation_name(Activation a);
std::string position_embedding_name(PositionEmbedding p);
Normalization normalization_from_name(const std::string& s);
Activation activation_from_name(const std::string& s);
PositionEmbedding position_embedding_from_name(const std::string& s);
kernels::RopeLayout rope_layout_from_name(const std::string& s);

}  // namespace megaton::models
