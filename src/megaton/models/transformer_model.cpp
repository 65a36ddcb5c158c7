#include "megaton/models/transformer_model.h"

#include <algorithm>
#include <cmath>

#include "megaton/core/rng.h"
#include "megaton/kernels/copy.h"

namespace megaton::models {

namespace {
nn::BlockSpec block_spec(const TransformerConfig& c) {
  nn::BlockSpec s;
  s.attn = {c.hidden_size, c.num_attention_heads, c.num_query_groups, c.head_dim()};
  s.ffn_hidden = c.ffn_hidden_size;
  s.rms_norm = c.normalization == Normalization::RMSNorm;
  s.norm_eps = c.norm_epsilon;
  s.swiglu = c.activation == Activation::SwiGLU;
  s.bias = c.add_bias_linear;
  return s;
}

const TransformerConfig& validated(const TransformerConfig& c) {
  c.validate();
  return c;
}
}  // namespace

TransformerModel::TransformerModel(const TransformerConfig& config)
    : config_(validated(config)),
      embedding_(config.vocab_size, config.hidden_size, config.max_position_embeddings,
                 config.position_embedding == PositionEmbedding::LearnedAbsolute),
      final_norm_("decoder.final_layernorm", config.hidden_size, config.normalization == Normalization::RMSNorm,
                  config.norm_epsilon),
      head_(config.hidden_size, config.vocab_size, config.tie_embeddings ? &embedding_.word : nullptr) {
  const bool rope = config.position_embedding == PositionEmbedding::Rope;
  if (rope) {
    const int64_t P = config.max_position_embeddings, D = config.head_dim();
    rope_.cos = Tensor::empty({P, D / 2}, DType::F32, MemCategory::Workspace, "rope.cos");
    rope_.sin = Tensor::empty({P, D / 2}, DType::F32, MemCategory::Workspace, "rope.sin");
    rope_.layout = config.rope_layout;
    kernels::rope_tables(rope_.cos.data<float>(), rope_.sin.data<float>(), P, D,
                         kernels::rope_inv_freq(D, config.rotary_base, config.rope_scaling));
  }
  const nn::BlockSpec spec = block_spec(config);
  for (int64_t i = 0; i < config.num_layers; ++i)
    layers_.push_back(std::make_unique<nn::TransformerBlock>("decoder.layers." + std::to_string(i), spec,
                                                             rope ? &rope_ : nullptr));
  embedding_.parameters(params_);
  for (auto& l : layers_) l->parameters(params_);
  final_norm_.parameters(params_);
  head_.parameters(params_);
}

void TransformerModel::init_weights(uint64_t seed) {
  const double std = config_.init_method_std;
  const double out_std = std / std::sqrt(2.0 * static_cast<double>(config_.num_layers));
  auto ends_with = [](const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for (nn::Parameter* p : params_) {
    float* v = p->value.data<float>();
    const int64_t n = p->value.numel();
    Philox rng(seed, stable_hash(p->name.data(), p->name.size()));
    if (ends_with(p->name, "layernorm.weight")) {
      std::fill(v, v + n, 1.0f);
    } else if (ends_with(p->name, ".bias")) {
      std::fill(v, v + n, 0.0f);
    } else {
      const bool scaled = ends_with(p->name, "linear_proj.weight") || ends_with(p->name, "linear_fc2.weight");
      fill_normal(v, n, rng, 0.0f, static_cast<float>(scaled ? out_std : std));
    }
  }
}

LossResult TransformerModel::forward(ModelCtx& ctx, const Tensor& tokens, const Tensor& targets, bool compute_grad,
                                     float loss_scale) {
  ctx.B = tokens.size(0);
  ctx.T = tokens.size(1);
  targets.expect_shape(tokens.shape());
  ctx.tokens = tokens;
  ctx.blocks.resize(layers_.size());
  Tensor h = embedding_.forward(tokens);
  for (size_t i = 0; i < layers_.size(); ++i) h = layers_[i]->forward(ctx.blocks[i], h, ctx.B, ctx.T);
  Tensor y = final_norm_.forward(ctx.final_norm, h);
  nn::LossSum s;
  if (compute_grad) {
    const int64_t count = nn::count_targets(targets);
    s = head_.loss_and_grad(y, targets, count ? loss_scale / static_cast<float>(count) : 0.0f, ctx.dhidden);
  } else {
    s = head_.loss(y, targets);
    ctx = {};
  }
  return {s.count ? s.sum / static_cast<double>(s.count) : 0.0, s.count};
}

void TransformerModel::backward(ModelCtx& ctx) {
  // Each block's W right after its B, so its saved activations are freed as backward goes down
  // (backward_input + backward_weight keep every block's until the end). Bitwise the same result.
  MEGATON_CHECK(ctx.dhidden.defined(), "backward without a training forward on this context");
  Tensor d = final_norm_.backward_input(ctx.final_norm, ctx.dhidden);
  ctx.dhidden = {};
  final_norm_.backward_weight(ctx.final_norm);
  for (size_t i = layers_.size(); i-- > 0;) {
    d = layers_[i]->backward_input(ctx.blocks[i], d, ctx.B, ctx.T);
    layers_[i]->backward_weight(ctx.blocks[i]);
  }
  embedding_.backward_weight(ctx.tokens, d);
  ctx = {};
}

void TransformerModel::backward_input(ModelCtx& ctx) {
  MEGATON_CHECK(ctx.dhidden.defined(), "backward_input without a training forward on this context");
  Tensor d = final_norm_.backward_input(ctx.final_norm, ctx.dhidden);
  ctx.dhidden = {};
  for (size_t i = layers_.size(); i-- > 0;) d = layers_[i]->backward_input(ctx.blocks[i], d, ctx.B, ctx.T);
  ctx.dembed = d;
}

void TransformerModel::backward_weight(ModelCtx& ctx) {
  MEGATON_CHECK(ctx.dembed.defined(), "backward_weight before backward_input on this context");
  // Reverse order of use, the order of the gradient buffer, so its buckets become ready in order.
  final_norm_.backward_weight(ctx.final_norm);
  for (size_t i = layers_.size(); i-- > 0;) layers_[i]->backward_weight(ctx.blocks[i]);
  embedding_.backward_weight(ctx.tokens, ctx.dembed);
  ctx = {};
}

std::vector<nn::KVCache> TransformerModel::new_kv_caches(int64_t B, int64_t max_len) const {
  std::vector<nn::KVCache> caches;
  for (const auto& l : layers_) caches.push_back(l->attention.new_cache(B, max_len));
  return caches;
}

Tensor TransformerModel::forward_cached(std::vector<nn::KVCache>& caches, const Tensor& tokens) {
  const int64_t B = tokens.size(0), T = tokens.size(1), C = config_.hidden_size;
  Tensor h = embedding_.forward(tokens, caches.at(0).len);
  for (size_t i = 0; i < layers_.size(); ++i) h = layers_[i]->forward_cached(caches[i], h, B, T);
  // Only the last position of each sequence needs logits.
  Tensor last = nn::new_activation({B, C}, "last_hidden");
  kernels::copy_rows(kernels::ExecContext::on(h), {last.view({B, 1, C}), 0, 0}, {h.view({B, T, C}), T - 1, 0}, 1, C);
  nn::NormCtx scratch;
  return head_.logits(final_norm_.forward(scratch, last));
}

}  // namespace megaton::models
