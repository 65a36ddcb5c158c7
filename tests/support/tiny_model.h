// The smallest useful GPT / Llama shapes for model-level tests: 2 layers, hidden 48, 6 heads
// (GQA with 2 kv heads for Llama), byte vocabulary, 64 positions.
#pragma once
#include <string>

#include "megaton/models/transformer_config.h"

namespace megaton::testing {

inline models::TransformerConfig tiny_config(const std::string& preset) {
  auto c = models::preset(preset);
  c.num_layers = 2;
  c.hidden_size = 48;
  c.num_attention_heads = 6;
  c.num_query_groups = preset == "gpt-tiny" ? 6 : 2;
  c.ffn_hidden_size = 80;
  c.max_position_embeddings = 64;
  return c;
}

}  // namespace megaton::testing
