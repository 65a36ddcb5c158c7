#include "megaton/train/training_step.h"

#include <chrono>
#include <cmath>

#include "megaton/optim/grad_clip.h"
#include "megaton/pipeline/executor.h"
#include "megaton/train/training_stage.h"

namespace megaton::train {

namespace {
// Elements per gradient bucket: Megatron's default (--ddp-bucket-size, 40M). Buckets matter once
// data-parallel reductions overlap backward; a single process just keeps the layout.
constexpr int64_t kGradBucketSize = 40'000'000;
}  // namespace

TrainingStep::TrainingStep(models::TransformerModel& model, const TrainConfig& cfg,
                           std::shared_ptr<const data::SampleSource> train)
    : model_(model),
      cfg_(cfg),
      train_(std::move(train)),
      buffer_(std::make_unique<nn::ParamAndGradBuffer>(model.parameters(), kGradBucketSize)),
      schedule_(pipeline::no_pipelining(cfg.grad_accum_steps(), false, static_cast<int>(model.chunks().size()))) {
  pipeline::validate(schedule_);
}

TrainingStep::Result TrainingStep::forward_backward(int64_t step, int64_t first_sample) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t mbs = cfg_.micro_batch_size;
  model_.refresh_compute_weights();  // the main weights changed since: optimizer step, resume, rewind
  buffer_->begin_step(schedule_.microbatches);
  if (!loader_ || loader_position_ != first_sample) {
    loader_.reset();  // stop the old workers before the new loader starts its own
    loader_ = std::make_unique<data::DataLoader>(
        train_, data::DataLoaderOptions{mbs, 0, 1, first_sample, static_cast<int>(cfg_.num_workers)});
    loader_position_ = first_sample;
  }
  TrainingStage stage(
      model_,
      [&](data::Batch& batch) {
        if (!loader_->next(batch)) fail("training data exhausted at sample ", loader_position_);
        loader_position_ += mbs;
      },
      schedule_.microbatches);
  pipeline::execute(schedule_.ops.at(0), stage);
  double loss = stage.mean_loss();
  buffer_->end_step();
  if (hook_) hook_(step, buffer_->grads(), loss);
  const double grad_norm = optim::global_norm({buffer_->grads()});
  return {loss, grad_norm, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

void TrainingStep::update(optim::AdamW& optimizer, double lr, double grad_norm) const {
  if (std::isfinite(grad_norm)) optimizer.step(lr, optim::clip_coefficient(grad_norm, cfg_.clip_grad));
}

}  // namespace megaton::train
