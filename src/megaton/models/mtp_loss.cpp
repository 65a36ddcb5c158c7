// TransformerModel's multi-token prediction loss op (transformer_model.h, nn/mtp_layer.h): run after
// the main loss of a training micro-batch, as Megatron-Core's MTP block after the decoder. Depth k
// (1-based) reads the ids k ahead and is scored on the targets k ahead (the last k positions of
// each sequence ignored); its loss is the mean over its scored tokens, weighted by
// mtp_loss_scaling_factor / mtp_num_layers (Megatron's MTPLossAutoScaler). Forward through every
// depth, then backward from the last: each depth's input and weight gradients at once, the shared
// embedding's and head's weight gradients accumulated as they come, and the gradient at the main
// model's final-norm output added to the one the main loss left in the last chunk's context.
#include "megaton/kernels/activation.h"
#include "megaton/kernels/ignore_index.h"
#include "megaton/kernels/tokens.h"
#include "megaton/models/transformer_model.h"

namespace megaton::models {

void TransformerModel::mtp_loss_and_grad(ModelCtx& ctx, const Tensor& output, const Tensor& targets,
                                         float loss_scale) {
  ChunkCtx& first = ctx.chunks.front();
  ChunkCtx& last = ctx.chunks.back();
  MEGATON_CHECK(first.tokens.defined() && last.dloss.defined(), "MTP loss without the main loss of a training "
                "forward on this context");
  const int64_t B = last.B, T = last.T, D = static_cast<int64_t>(mtp_.size());
  const auto on = kernels::ExecContext::on(output);
  if (gate_) {
    nn::ParameterList params;
    for (auto& d : mtp_) d->parameters(params);
    gate_(params);
  }
  std::vector<nn::MtpCtx> ctxs(mtp_.size());
  std::vector<Tensor> ids(mtp_.size()), dheads(mtp_.size());
  Tensor h = output;
  for (int64_t k = 0; k < D; ++k) {
    const auto i = static_cast<size_t>(k);
    ids[i] = Tensor::empty({B, T}, DType::I32, MemCategory::Activations, "mtp.ids");
    Tensor tg = Tensor::empty({B, T}, DType::I32, MemCategory::Activations, "mtp.targets");
    kernels::shift_tokens(on, ids[i], first.tokens, k + 1, 0);
    kernels::shift_tokens(on, tg, targets, k + 1, kernels::kIgnoreIndex);
    h = mtp_[i]->forward(ctxs[i], embedding_->forward(ids[i], 0, compute_dtype_), h, B, T);
    const int64_t count = nn::count_targets(tg);
    const double weight = config_.mtp_loss_scaling_factor / static_cast<double>(D);
    const float scale = count ? static_cast<float>(loss_scale * weight / static_cast<double>(count)) : 0.0f;
    const nn::LossSum s = head_->loss_and_grad(h, tg, scale, dheads[i]);
    if (mtp_step_.sums.size() == mtp_.size() && count) mtp_step_.sums[i] += s.sum / static_cast<double>(count);
  }
  ++mtp_step_.microbatches;
  Tensor d;  // the gradient at depth k's output: its head's, plus what depth k + 1 sends back
  for (int64_t k = D; k-- > 0;) {
    const auto i = static_cast<size_t>(k);
    if (d.defined()) kernels::residual_forward(on, dheads[i], dheads[i], d);
    auto [demb, dhidden] = mtp_[i]->backward(ctxs[i], dheads[i], B, T);
    embedding_->backward_weight(ids[i], demb);
    d = dhidden;
  }
  kernels::residual_forward(on, last.dloss, last.dloss, d);
}

std::vector<double> TransformerModel::mtp_step_losses() const {
  std::vector<double> out;
  for (double s : mtp_step_.sums)
    out.push_back(mtp_step_.microbatches ? s / static_cast<double>(mtp_step_.microbatches) : 0.0);
  return out;
}

}  // namespace megaton::models
