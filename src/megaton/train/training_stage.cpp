#include "megaton/train/training_stage.h"

namespace megaton::train {

TrainingStage::TrainingStage(models::TransformerModel& model, std::function<void(data::Batch&)> next_batch,
                             int64_t microbatches, bool defer_head_weight_grad)
    : model_(model),
      next_batch_(std::move(next_batch)),
      microbatches_(microbatches),
      defer_head_weight_grad_(defer_head_weight_grad) {
  MEGATON_CHECK(microbatches > 0, "a training step needs at least one micro-batch, got ", microbatches);
}

models::ModelCtx& TrainingStage::context(int64_t microbatch, const char* op) {
  auto it = in_flight_.find(microbatch);
  if (it == in_flight_.end()) fail("schedule runs ", op, " of micro-batch ", microbatch, " before its forward");
  return it->second;
}

void TrainingStage::forward(int64_t microbatch, int chunk) {
  MEGATON_CHECK(chunk == 0, "the trainer's model is one chunk; the schedule asks for chunk ", chunk);
  // The source hands batches out in order, so forwards must come in micro-batch order.
  MEGATON_CHECK(microbatch == forwards_, "schedule runs the forward of micro-batch ", microbatch, " but micro-batch ",
                forwards_, " is next");
  data::Batch batch;
  next_batch_(batch);
  const int64_t B = batch.micro_batch_size, T = batch.seq_length;
  Tensor inputs = Tensor::empty({B, T}, DType::I32, MemCategory::Activations, "inputs");
  Tensor targets = Tensor::empty({B, T}, DType::I32, MemCategory::Activations, "targets");
  std::copy(batch.inputs.begin(), batch.inputs.end(), inputs.data<int32_t>());
  std::copy(batch.targets.begin(), batch.targets.end(), targets.data<int32_t>());
  const float scale = 1.0f / static_cast<float>(microbatches_);
  loss_sum_ += model_.forward(in_flight_[microbatch], inputs, targets, true, scale, defer_head_weight_grad_).loss /
               static_cast<double>(microbatches_);
  ++forwards_;
}

void TrainingStage::backward_input(int64_t microbatch, int) { model_.backward_input(context(microbatch, "B")); }

void TrainingStage::backward_weight(int64_t microbatch, int) {
  model_.backward_weight(context(microbatch, "W"));
  in_flight_.erase(microbatch);
  ++weight_grads_;
}

void TrainingStage::backward(int64_t microbatch, int) {
  model_.backward(context(microbatch, "B"));
  in_flight_.erase(microbatch);
  ++weight_grads_;
}

double TrainingStage::mean_loss() const {
  MEGATON_CHECK(forwards_ == microbatches_ && weight_grads_ == microbatches_ && in_flight_.empty(), "the schedule ran ",
                forwards_, " forwards and ", weight_grads_, " weight-gradient passes of ", microbatches_,
                " micro-batches");
  return loss_sum_;
}

}  // namespace megaton::train
