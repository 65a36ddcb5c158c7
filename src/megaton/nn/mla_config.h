// The multi-latent attention settings of a model (attention_type "mla", DeepSeek-V2 / V3), named as
// Megatron-LM's MLATransformerConfig: queries and keys / values are projected down to small latents
// (q_lora_rank, kv_lora_rank) and back up per head; each head's query and key are a part without
// position (qk_head_dim, DeepSeek's qk_nope_head_dim) and a rotary part (qk_pos_emb_head_dim,
// qk_rope_head_dim) whose key is one head shared by all; values have v_head_dim.
#pragma once
#include <cstdint>

namespace megaton::nn {

struct MlaConfig {
  int64_t q_lora_rank = 0;  // 0: one direct query projection (DeepSeek-V2-Lite), no query latent
  int64_t kv_lora_rank = 32;
  int64_t qk_head_dim = 16;
  int64_t qk_pos_emb_head_dim = 8;
  int64_t v_head_dim = 16;

  int64_t qk_dim() const { return qk_head_dim + qk_pos_emb_head_dim; }  // a query / key head
  // Throws naming the key and the accepted range for any value out of range.
  void validate() const;
};

}  // namespace megaton::nn
