#include "megaton/train/training_stage.h"

namespace megaton::train {

TrainingStage::TrainingStage(models::TransformerModel& model, std::function<void(data::Batch&)> next_batch,
                             int64_t microbatches, bool defer_head_weight_grad, int64_t data_parallel_size)
    : model_(model),
      next_batch_(std::move(next_batch)),
      microbatches_(microbatches),
      grad_scale_(1.0f / static_cast<float>(microbatches * data_parallel_size)),
      defer_head_weight_grad_(defer_head_weight_grad) {
  MEGATON_CHECK(microbatches > 0, "a training step needs at least one micro-batch, got ", microbatches);
  MEGATON_CHECK(data_parallel_size > 0, "data-parallel size ", data_parallel_size);
  model_.set_moe_aux_loss_grad_scale(grad_scale_);
}

TrainingStage::InFlight& TrainingStage::in_flight(int64_t microbatch, const char* op) {
  auto it = in_flight_.find(microbatch);
  if (it == in_flight_.end()) fail("schedule runs ", op, " of micro-batch ", microbatch, " before its forward");
  return it->second;
}

void TrainingStage::forward(int64_t microbatch, int chunk) {
  MEGATON_CHECK(chunk >= 0 && chunk < chunks(), "schedule asks for chunk ", chunk, " of a model with ", chunks());
  if (chunk == 0) {
    // The source hands batches out in order, so first-chunk forwards come in micro-batch order.
    MEGATON_CHECK(microbatch == forwards_, "schedule runs the forward of micro-batch ", microbatch,
                  " but micro-batch ", forwards_, " is next");
    data::Batch batch;
    next_batch_(batch);
    InFlight& mb = in_flight_[microbatch];
    mb.B = batch.micro_batch_size;
    mb.T = batch.seq_length;
    mb.output = Tensor::empty({mb.B, mb.T}, DType::I32, MemCategory::Activations, "inputs");
    mb.targets = Tensor::empty({mb.B, mb.T}, DType::I32, MemCategory::Activations, "targets");
    std::copy(batch.inputs.begin(), batch.inputs.end(), mb.output.data<int32_t>());
    std::copy(batch.targets.begin(), batch.targets.end(), mb.targets.data<int32_t>());
    mb.ctx.chunks.clear();  // contexts are move-only: start from fresh ones
    mb.ctx.chunks.resize(model_.chunks().size());
    ++forwards_;
  }
  InFlight& mb = in_flight(microbatch, "F");
  MEGATON_CHECK(chunk == mb.forwarded, "schedule runs the forward of chunk ", chunk, " of micro-batch ", microbatch,
                " but chunk ", mb.forwarded, " is next");
  const auto c = static_cast<size_t>(chunk);
  mb.output = model_.chunks()[c].forward(mb.ctx.chunks[c], mb.output, mb.B, mb.T);
  ++mb.forwarded;
  if (chunk + 1 < chunks()) return;
  loss_sum_ += model_.loss(mb.ctx, mb.output, mb.targets, true, grad_scale_, defer_head_weight_grad_).loss /
               static_cast<double>(microbatches_);
  mb.output = {};
}

Tensor TrainingStage::chunk_backward_input(InFlight& mb, int chunk, bool with_weight_grads) {
  MEGATON_CHECK(mb.forwarded == chunks() && chunk == chunks() - 1 - mb.backwarded, "schedule runs the backward of chunk ",
                chunk, " before the forward of every chunk and the backward of every later chunk");
  models::ModelChunk& mc = model_.chunks()[static_cast<size_t>(chunk)];
  models::ChunkCtx& cc = mb.ctx.chunks[static_cast<size_t>(chunk)];
  ++mb.backwarded;
  return with_weight_grads ? mc.backward(cc, mb.dinput) : mc.backward_input(cc, mb.dinput);
}

void TrainingStage::chunk_weight_grads_done(int64_t microbatch, InFlight& mb) {
  if (++mb.weight_grads < chunks()) return;
  in_flight_.erase(microbatch);
  ++weight_grads_;
}

void TrainingStage::backward_input(int64_t microbatch, int chunk) {
  InFlight& mb = in_flight(microbatch, "B");
  mb.dinput = chunk_backward_input(mb, chunk, false);
}

void TrainingStage::backward_weight(int64_t microbatch, int chunk) {
  InFlight& mb = in_flight(microbatch, "W");
  model_.chunks().at(static_cast<size_t>(chunk)).backward_weight(mb.ctx.chunks[static_cast<size_t>(chunk)]);
  chunk_weight_grads_done(microbatch, mb);
}

void TrainingStage::backward(int64_t microbatch, int chunk) {
  InFlight& mb = in_flight(microbatch, "B");
  mb.dinput = chunk_backward_input(mb, chunk, true);
  chunk_weight_grads_done(microbatch, mb);
}

double TrainingStage::mean_loss() const {
  MEGATON_CHECK(forwards_ == microbatches_ && weight_grads_ == microbatches_ && in_flight_.empty(), "the schedule ran ",
                forwards_, " forwards and ", weight_grads_, " weight-gradient passes of ", microbatches_,
                " micro-batches");
  return loss_sum_;
}

}  // namespace megaton::train
