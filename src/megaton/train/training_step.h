// One training step, apart from everything else the trainer does: the model's flat gradient
// buffer, the pipeline schedule run through the executor over the step's micro-batches, the
// data-parallel gradient reduction, the global grad norm, and clipping + the optimizer update.
// Checkpoints, logging and rewinds live in the trainer; faults are injected through the gradient
// hook, not by the step itself.
//
// Data parallelism (Megatron's DistributedDataParallel): each rank trains on its slice of every
// global batch; with overlap_grad_reduce each gradient bucket is summed over the data-parallel
// group asynchronously as soon as backward has finished it in the step's last micro-batch, while
// backward goes on with earlier layers, else all buckets after backward. The loss is averaged over
// the group and a non-finite gradient on any rank makes the norm non-finite on all of them, so
// every rank takes the same decisions (skip, rewind).
//
// Expert parallelism lives in the model too (its MoE layers' dispatchers move tokens over the ep
// group); the routed experts' gradients sit in buckets of their own, summed over the expert-data-
// parallel group (the ranks holding the same experts: under tensor parallelism also the
// tensor-parallel ranks, which each fed them a block of the tokens), and the grad norm sums their
// squares over the ep group, after the tensor-parallel sum of the rest.
//
// Tensor parallelism lives in the model (its modules run their own collectives); the step adds what
// Megatron's finalize_model_grads does after the data-parallel reduction: the gradients several
// tensor-parallel ranks compute parts of (norms under sequence parallelism, replicated k / v heads)
// are summed over the tensor-parallel group, and the grad norm adds every rank's elements once
// (replicated parameters counted on one rank, vocabulary padding on none).
//
// Pipeline parallelism (cfg.pipeline_model_parallel_size > 1): the step runs the op list of this
// rank's stage of cfg.pipeline_schedule (pipeline/generators.h) through TrainingStage, which moves
// activations and gradients point-to-point over the pipeline group. The model holds only this
// stage's model chunks (models/stage_layout.h, train/pipeline_layout.h), so the gradient buffer and
// the optimizer cover this stage's parameters alone and each stage steps its own layers. After
// backward the tied embedding's two copies (the first stage's embedding, the last stage's head
// weight) are summed over a two-rank embedding group (Megatron's) so they stay identical; the grad
// norm adds every stage's squares over the pipeline group (the last stage's copy left out: each
// element counted once), so clipping and the NaN decision are the same on every stage. The loss
// is computed by the last stage and summed over the group (the others add 0). Checkpoints, rewind
// points and the export gather the whole model (state_snapshot.h).
//
// The step owns the optimizer: plain AdamW over the whole buffer, or with
// parallel.use_distributed_optimizer the distributed optimizer (parallel/distributed_optimizer.h):
// the buffer is then sharded over the data-parallel group, each bucket is reduce-scattered instead
// of all-reduced (at the same moments), the grad norm adds the ranks' shards, and the update
// all-gathers the weights. Everything else (micro-batches, loss scaling, timing) is shared.
#pragma once
#include <functional>
#include <memory>
#include <optional>

#include "megaton/data/data_loader.h"
#include "megaton/models/transformer_model.h"
#include "megaton/nn/param_and_grad_buffer.h"
#include "megaton/optim/adamw.h"
#include "megaton/parallel/communicator.h"
#include "megaton/parallel/distributed_optimizer.h"
#include "megaton/pipeline/executor.h"
#include "megaton/pipeline/generators.h"
#include "megaton/train/step_undo.h"
#include "megaton/train/train_config.h"

namespace megaton::train {

class TrainingStep {
 public:
  struct Result {
    double loss, grad_norm, seconds;
    double comm_wait_seconds = 0;  // blocked on tensor-parallel collectives and gradient reductions
    std::vector<nn::MoeStats> moe;  // per MoE layer, this process's routing over the step's micro-batches
    // FP16: the loss scale the step's backward ran with (0 without loss scaling), and whether its
    // gradients overflowed so that the dynamic scaler skips it (update() then changes nothing).
    double loss_scale = 0;
    bool skipped = false;
    // Optimizer post-validation: the eager update stands (update() then adds nothing).
    bool updated = false;
    // Multi-token prediction: per depth, this process's mean loss over the step's micro-batches (not
    // part of "loss", which is the main head's).
    std::vector<double> mtp_losses;
  };
  // Called after backward with the step number, the flat gradients and the step's loss, before the
  // grad norm is taken: where fault injection corrupts a step.
  using GradientHook = std::function<void(int64_t step, const Tensor& grads, double& loss)>;

  // Wraps the model's parameters in a gradient buffer and builds the optimizer over it (AdamW with
  // the config's settings; distributed over data_parallel when cfg.use_distributed_optimizer).
  // data_parallel: the group gradients are summed over; its size must be cfg.data_parallel_size
  // (or 1 with data_parallel_size 0). pipeline: this rank's pipeline group (size
  // cfg.pipeline_model_parallel_size); the model holds this stage's model chunks of the schedule.
  // expert_data_parallel: the group the routed experts' gradients are summed over under expert
  // and tensor parallelism (the ranks holding the same experts, tp x dp / ep); null: data_parallel.
  TrainingStep(models::TransformerModel& model, const TrainConfig& cfg, std::shared_ptr<const data::SampleSource> train,
               parallel::Communicator& data_parallel, parallel::Communicator& pipeline,
               parallel::Communicator* expert_data_parallel = nullptr);
  ~TrainingStep();
  TrainingStep(const TrainingStep&) = delete;
  TrainingStep& operator=(const TrainingStep&) = delete;
  const nn::ParamAndGradBuffer& buffer() const { return *buffer_; }
  optim::Optimizer& optimizer() { return *optimizer_; }
  const optim::Optimizer& optimizer() const { return *optimizer_; }
  // The distributed optimizer when the config asks for it, else null.
  const parallel::DistributedOptimizer* distributed_optimizer() const { return distributed_; }
  void on_gradients(GradientHook hook) { hook_ = std::move(hook); }
  // Every schedule op of the following steps is timed into `times` (logging.trace); null: none.
  void time_ops(pipeline::OpTimes* times) { op_times_ = times; }
  const pipeline::Schedule& schedule() const { return schedule_; }

  // Forward and backward of the global batch starting at sample first_sample: the gradients hold the
  // mean over it (on every data-parallel rank). Reads this rank's slices through a prefetching
  // loader, recreated when first_sample is not where it stands. With
  // parallel.optimizer_post_validation the stage then steps with learning rate lr at once, before
  // the loss and grad norm are summed over the pipeline group, and undoes that step when the norm
  // calls for clipping or is not finite (Result::updated says whether it stands).
  Result forward_backward(int64_t step, int64_t first_sample, double lr);
  // Clips to cfg.clip_grad and updates with lr; a non-finite norm skips the update (on every rank:
  // the norm is the same everywhere); nothing when the eager update stands. Not called for a step the
  // loss scaler skipped or the trainer rejected.
  void update(double lr, const Result& r);
  // FP16's loss scaler state (empty without fp16), and its restore on resume or rewind (an empty
  // state, from a run without fp16, keeps the initial scale).
  std::vector<double> loss_scaler_state() const { return scaler_ ? scaler_->state() : std::vector<double>{}; }
  void load_loss_scaler_state(const std::vector<double>& state) {
    if (scaler_ && !state.empty()) scaler_->load_state(state);
  }

 private:
  models::TransformerModel& model_;
  const TrainConfig& cfg_;
  std::shared_ptr<const data::SampleSource> train_;
  parallel::Communicator& dp_;
  parallel::Communicator& pp_;
  parallel::Communicator& edp_;
  // Whether any gradient bucket is summed over other ranks (data-parallel, or the experts' over
  // tensor-parallel ranks too).
  bool reduces() const { return dp_.size() > 1 || edp_.size() > 1; }
  std::unique_ptr<nn::ParamAndGradBuffer> buffer_;
  std::unique_ptr<optim::Optimizer> optimizer_;             // over buffer_
  parallel::DistributedOptimizer* distributed_ = nullptr;  // optimizer_, when it is the distributed one
  std::vector<parallel::WorkHandle> reductions_;  // this step's bucket reductions in flight
  nn::ParameterList shared_grads_;               // parameters with gradients summed over tensor parallelism
  nn::Parameter* embedding_group_ = nullptr;     // this stage's copy of a tied embedding held by two stages
  std::unique_ptr<parallel::Communicator> embedding_comm_;  // the two stages holding those copies
  std::unique_ptr<parallel::Communicator> copies_;  // DualPipe: this stage and the one holding the other copies
  std::vector<nn::ElementRange> norm_ranges_;    // the gradient elements this rank adds to the norm
  std::vector<nn::ElementRange> expert_norm_ranges_;  // ... of them, its own experts' (summed over ep)
  pipeline::Schedule schedule_;  // this step's op lists (no pipelining at pp 1: F, B, W per micro-batch)
  std::unique_ptr<data::DataLoader> loader_;
  int64_t loader_position_ = -1;
  GradientHook hook_;
  pipeline::OpTimes* op_times_ = nullptr;
  std::optional<optim::LossScaler> scaler_;  // [precision] fp16
  std::unique_ptr<StepUndo> undo_;           // parallel.optimizer_post_validation

  void reduce_bucket(size_t bucket);  // all-reduce, or the distributed optimizer's reduce-scatter
  void wait_reductions();  // waits for the reductions in flight and forgets them
  // FP8 delayed scaling: the newest amaxes reduced (max) over the data- and tensor-parallel groups
  // (not pipeline: a layer lives on one stage), then every layer's scales updated and histories
  // rolled. Nothing without FP8.
  void begin_fp8_step();
  // Sums the tied embedding's copies over the embedding group, waits for every bucket's reduction
  // (issuing them first without overlap), then sums the shared tensor-parallel gradients; returns
  // the seconds blocked.
  double finish_reductions();
  // The global L2 norm of the reduced gradients (every stage's): the same on every rank.
  double grad_norm() const;
  // FP16: the gradients divided by the loss scale their backward ran with.
  void unscale_gradients(double loss_scale);
};

}  // namespace megaton::train
