#include "megaton/models/model_chunk.h"

#include <algorithm>

namespace megaton::models {

ModelChunk::ModelChunk(nn::Embedding* embedding, Layers layers, nn::Norm* final_norm, nn::OutputHead* head)
    : embedding_(embedding), layers_(layers), final_norm_(final_norm), head_(head) {
  MEGATON_CHECK((final_norm == nullptr) == (head == nullptr), "a last chunk has both the final norm and the head");
}

Tensor ModelChunk::forward(ChunkCtx& ctx, const Tensor& input, int64_t B, int64_t T) {
  ctx.B = B;
  ctx.T = T;
  ctx.blocks.resize(layers_.size());
  Tensor h = input;
  if (is_first()) {
    ctx.tokens = input;
    gate(*embedding_);
    h = embedding_->forward(input, 0, compute_dtype_);
  }
  if (recompute_.full()) ctx.unit_inputs.assign(layers_.size(), Tensor());
  for (size_t i = 0; i < layers_.size(); ++i) {
    const auto [first, end] = recompute_unit(i);
    if (end > first && first == i) ctx.unit_inputs[i] = h;
    gate(*layers_[i]);
    h = layers_[i]->forward(ctx.blocks[i], h, B, T);
    if (end > first) ctx.blocks[i] = {};  // only the unit's input is kept
  }
  if (!is_last()) return h;
  gate(*final_norm_);
  return final_norm_->forward(ctx.final_norm, h);
}

std::pair<size_t, size_t> ModelChunk::recompute_unit(size_t i) const {
  if (!recompute_.full()) return {0, 0};
  const auto k = static_cast<size_t>(recompute_.num_layers);
  if (recompute_.method == nn::RecomputeMethod::Block) return i < k ? std::pair{i, i + 1} : std::pair<size_t, size_t>{0, 0};
  const size_t first = i / k * k;
  return {first, std::min(first + k, layers_.size())};
}

void ModelChunk::rebuild_unit(ChunkCtx& ctx, size_t i) {
  const auto [first, end] = recompute_unit(i);
  if (end == first || i + 1 != end) return;
  MEGATON_CHECK(ctx.unit_inputs.size() == layers_.size() && ctx.unit_inputs[first].defined(),
                "recompute of layers ", first, "..", end - 1, " without their forward's saved input");
  Tensor h = ctx.unit_inputs[first];
  ctx.unit_inputs[first] = {};
  for (size_t j = first; j < end; ++j) h = layers_[j]->forward(ctx.blocks[j], h, ctx.B, ctx.T);
}

nn::LossSum ModelChunk::loss(ChunkCtx& ctx, const Tensor& output, const Tensor& targets, bool compute_grad,
                             float grad_scale, bool defer_head_weight_grad) {
  MEGATON_CHECK(is_last(), "the loss op runs on the last model chunk only");
  gate(*head_);
  if (!compute_grad) return head_->loss(output, targets);
  return head_->loss_and_grad(output, targets, grad_scale, ctx.dloss, defer_head_weight_grad ? &ctx.head : nullptr);
}

Tensor ModelChunk::output_grad(ChunkCtx& ctx, const Tensor& doutput, const char* op) {
  if (!is_last()) {
    MEGATON_CHECK(doutput.defined(), op, " of a chunk that is not the last needs the next chunk's input gradient");
    return doutput;
  }
  MEGATON_CHECK(ctx.dloss.defined(), op, " of the last chunk without a training loss on this context");
  Tensor d = final_norm_->backward_input(ctx.final_norm, ctx.dloss);
  ctx.dloss = {};
  return d;
}

Tensor ModelChunk::backward_input(ChunkCtx& ctx, const Tensor& doutput) {
  Tensor d = output_grad(ctx, doutput, "backward_input");
  for (size_t i = layers_.size(); i-- > 0;) {
    rebuild_unit(ctx, i);
    d = layers_[i]->backward_input(ctx.blocks[i], d, ctx.B, ctx.T);
  }
  ctx.input_grads_done = true;
  if (!is_first()) return d;
  ctx.dembed = d;
  return {};
}

void ModelChunk::last_weight_grads(ChunkCtx& ctx) {
  if (ctx.head.dlogits.defined()) head_->backward_weight(ctx.head);
  final_norm_->backward_weight(ctx.final_norm);
}

void ModelChunk::backward_weight(ChunkCtx& ctx) {
  MEGATON_CHECK(ctx.input_grads_done, "backward_weight of a model chunk before its backward_input");
  // Reverse order of use, the order of the gradient buffer, so its buckets become ready in order.
  if (is_last()) last_weight_grads(ctx);
  for (size_t i = layers_.size(); i-- > 0;) layers_[i]->backward_weight(ctx.blocks[i]);
  if (is_first()) embedding_->backward_weight(ctx.tokens, ctx.dembed);
  ctx = {};
}

Tensor ModelChunk::backward(ChunkCtx& ctx, const Tensor& doutput) {
  Tensor d = output_grad(ctx, doutput, "backward");
  if (is_last()) last_weight_grads(ctx);
  for (size_t i = layers_.size(); i-- > 0;) {
    rebuild_unit(ctx, i);
    d = layers_[i]->backward_input(ctx.blocks[i], d, ctx.B, ctx.T);
    layers_[i]->backward_weight(ctx.blocks[i]);
  }
  if (is_first()) {
    embedding_->backward_weight(ctx.tokens, d);
    d = {};
  }
  ctx = {};
  return d;
}

}  // namespace megaton::models
