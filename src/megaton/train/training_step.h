// One training step, apart from everything else the trainer does: the model's flat gradient
// buffer, the pipeline schedule run through the executor over the step's micro-batches, the
// global grad norm, and clipping + the optimizer update. Checkpoints, logging and rewinds live in
// the trainer; faults are injected through the gradient hook, not by the step itself.
#pragma once
#include <functional>
#include <memory>

#include "megaton/data/data_loader.h"
#include "megaton/models/transformer_model.h"
#include "megaton/nn/param_and_grad_buffer.h"
#include "megaton/optim/adamw.h"
#include "megaton/pipeline/generators.h"
#include "megaton/train/train_config.h"

namespace megaton::train {

class TrainingStep {
 public:
  struct Result {
    double loss, grad_norm, seconds;
  };
  // Called after backward with the step number, the flat gradients and the step's loss, before the
  // grad norm is taken: where fault injection corrupts a step.
  using GradientHook = std::function<void(int64_t step, const Tensor& grads, double& loss)>;

  // Wraps the model's parameters in a gradient buffer (before the optimizer is built on it).
  TrainingStep(models::TransformerModel& model, const TrainConfig& cfg, std::shared_ptr<const data::SampleSource> train);
  const nn::ParamAndGradBuffer& buffer() const { return *buffer_; }
  void on_gradients(GradientHook hook) { hook_ = std::move(hook); }

  // Forward and backward of the global batch starting at sample first_sample: the gradients hold the
  // mean over it. Reads through a prefetching loader, recreated when first_sample is not where it stands.
  Result forward_backward(int64_t step, int64_t first_sample);
  // Clips to cfg.clip_grad and updates with lr; a non-finite norm skips the update.
  void update(optim::AdamW& optimizer, double lr, double grad_norm) const;

 private:
  models::TransformerModel& model_;
  const TrainConfig& cfg_;
  std::shared_ptr<const data::SampleSource> train_;
  std::unique_ptr<nn::ParamAndGradBuffer> buffer_;
  pipeline::Schedule schedule_;  // no pipelining: F, B, W per micro-batch
  std::unique_ptr<data::DataLoader> loader_;
  int64_t loader_position_ = -1;
  GradientHook hook_;
};

}  // namespace megaton::train
