// The smallest useful GPT / Llama shapes for model-level tests: 2 layers, hidden 48, 6 heads
// (GQA with 2 kv heads for Llama), byte vocabulary, 64 positions.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "megaton/core/allocator.h"
#include "megaton/core/tensor.h"
#include "megaton/models/transformer_model.h"
#include "megaton/nn/parameter.h"

namespace megaton::testing {

inline models::TransformerConfig tiny_config(const std::string& preset) {
  auto c = models::preset(preset);
  c.num_layers = 2;
  c.hidden_size = 48;
  c.num_attention_heads = 6;
  c.num_query_groups = preset == "gpt-tiny" || c.is_mla() ? 6 : 2;  // MLA has no kv groups
  c.ffn_hidden_size = 80;
  c.max_position_embeddings = 64;
  return c;
}

// Deterministic byte-vocabulary inputs and targets [B, T] (i32) for model-level tests.
// Every parameter's gradient, as doubles, in parameter order.
inline std::vector<std::vector<double>> gradients_of(const nn::ParameterList& params) {
  std::vector<std::vector<double>> grads;
  for (const nn::Parameter* p : params) {
    const float* g = p->grad.data<float>();
    grads.emplace_back(g, g + p->grad.numel());
  }
  return grads;
}

// A loss and every parameter's gradient, bit for bit.
inline bool bitwise_equal(double loss_a, const std::vector<std::vector<double>>& a, double loss_b,
                          const std::vector<std::vector<double>>& b) {
  if (std::memcmp(&loss_a, &loss_b, sizeof(double)) != 0 || a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(double)) != 0)
      return false;
  return true;
}

// Biases start at zero and norm weights at one, which would make a dropped or doubled bias (or norm
// term) invisible: gives each its own values.
inline void give_biases_and_norms_values(const nn::ParameterList& params) {
  int64_t k = 0;
  for (nn::Parameter* p : params)
    if (p->name.find("bias") != std::string::npos || p->name.find("norm") != std::string::npos)
      for (int64_t i = 0; i < p->value.numel(); ++i) p->value.data<float>()[i] += 0.3f * std::sin(static_cast<float>(++k));
}

// ||a - b|| / ||b||, NaN-safe (a NaN makes it NaN, which fails any < comparison). Two zero vectors (a
// parameter no loss reaches, such as MoE's selection-only expert bias) agree exactly: 0; a nonzero a
// against a zero b is infinitely off.
inline double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += (a[i] - b[i]) * (a[i] - b[i]), ref += b[i] * b[i];
  if (ref == 0) return diff == 0 ? 0.0 : diff > 0 ? INFINITY : diff;
  return std::sqrt(diff / ref);
}

// max |a - b| / max |b| over two f32 tensors of b's size (logits, hidden states); NaN when either
// holds a non-finite value, which fails any < comparison.
inline double relative_to_largest(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double x = a.data<float>()[i], y = b.data<float>()[i];
    if (!std::isfinite(x) || !std::isfinite(y)) return NAN;
    diff = std::max(diff, std::abs(x - y));
    scale = std::max(scale, std::abs(y));
  }
  return diff / scale;
}

inline std::pair<Tensor, Tensor> tiny_batch(int64_t B, int64_t T) {
  Tensor in = Tensor::empty({B, T}, DType::I32), tg = Tensor::empty({B, T}, DType::I32);
  for (int64_t i = 0; i < B * T; ++i) {
    in.data<int32_t>()[i] = static_cast<int32_t>((i * 7 + 3) % 257);
    tg.data<int32_t>()[i] = static_cast<int32_t>((i * 13 + 5) % 257);
  }
  return {in, tg};
}

// Activation bytes still alive after a training forward of tiny_batch(2, 32): what m keeps for
// backward.
inline int64_t kept_activations(models::TransformerModel& m) {
  auto [in, tg] = tiny_batch(2, 32);
  m.refresh_compute_weights();
  const auto live = [] { return Allocator::host().stats().live[static_cast<size_t>(MemCategory::Activations)]; };
  const int64_t before = static_cast<int64_t>(live());
  models::ModelCtx ctx;
  m.forward(ctx, in, tg, true);
  return static_cast<int64_t>(live()) - before;
}

}  // namespace megaton::testing
