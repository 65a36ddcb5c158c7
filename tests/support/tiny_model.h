// The smallest useful GPT / Llama shapes for model-level tests: 2 layers, hidden 48, 6 heads
// (GQA with 2 kv heads for Llama), byte vocabulary, 64 positions.
#pragma once
#include <string>
#include <utility>

#include "megaton/core/tensor.h"
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

// Deterministic byte-vocabulary inputs and targets [B, T] (i32) for model-level tests.
inline std::pair<Tensor, Tensor> tiny_batch(int64_t B, int64_t T) {
  Tensor in = Tensor::empty({B, T}, DType::I32), tg = Tensor::empty({B, T}, DType::I32);
  for (int64_t i = 0; i < B * T; ++i) {
    in.data<int32_t>()[i] = static_cast<int32_t>((i * 7 + 3) % 257);
    tg.data<int32_t>()[i] = static_cast<int32_t>((i * 13 + 5) % 257);
  }
  return {in, tg};
}

}  // namespace megaton::testing
