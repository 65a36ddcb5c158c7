#include "megaton/train/training_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "megaton/nn/tensor_shards.h"
#include "megaton/optim/grad_clip.h"
#include "megaton/parallel/tensor_parallel_mappings.h"
#include "megaton/pipeline/executor.h"
#include "megaton/train/training_stage.h"

namespace megaton::train {

TrainingStep::TrainingStep(models::TransformerModel& model, const TrainConfig& cfg,
                           std::shared_ptr<const data::SampleSource> train, parallel::Communicator& data_parallel,
                           parallel::Communicator& pipeline, parallel::Communicator* expert_data_parallel)
    : model_(model),
      cfg_(cfg),
      train_(std::move(train)),
      dp_(data_parallel),
      pp_(pipeline),
      edp_(expert_data_parallel ? *expert_data_parallel : data_parallel),
      buffer_(std::make_unique<nn::ParamAndGradBuffer>(model.parameters(), cfg.bucket_size,
                                                       cfg.use_distributed_optimizer ? dp_.size() : 1,
                                                       cfg.use_distributed_optimizer ? edp_.size() : 1)),
      schedule_(pipeline.size() == 1
                    ? pipeline::no_pipelining(cfg.grad_accum_steps(), false, static_cast<int>(model.num_chunks()))
                    : pipeline::generate(cfg.pipeline_schedule, pipeline.size(),
                                         static_cast<int>(pipeline_chunks_per_rank(cfg)), cfg.grad_accum_steps())) {
  if (pp_.size() != cfg.pipeline_model_parallel_size)
    fail("pipeline group '", pp_.name(), "' has ", pp_.size(), " ranks but the config sets pipeline_model_parallel_size ",
         cfg.pipeline_model_parallel_size);
  if (dp_.size() != std::max<int64_t>(1, cfg.data_parallel_size))
    fail("data-parallel group '", dp_.name(), "' has ", dp_.size(), " ranks but the config resolved data_parallel_size ",
         cfg.data_parallel_size);
  const optim::AdamWConfig adamw{cfg.lr, cfg.adam_beta1, cfg.adam_beta2, cfg.adam_eps, cfg.weight_decay};
  const nn::ExpertParallel& ep = model_.expert_parallel();
  const nn::TensorParallel& tp = model_.tensor_parallel();
  if (edp_.size() * ep.size() != dp_.size() * tp.size())
    fail("expert-data-parallel group '", edp_.name(), "' has ", edp_.size(), " ranks and the expert-parallel group ",
         ep.size(), ", but the data-parallel group has ", dp_.size(), " and the tensor-parallel group ", tp.size());
  // The routed experts' gradients are summed over another group than the dense ones'.
  const bool experts_apart = ep.active() || tp.active();
  if (cfg.use_distributed_optimizer) {
    auto distributed =
        std::make_unique<parallel::DistributedOptimizer>(*buffer_, adamw, dp_, cfg.overlap_param_gather, &edp_);
    distributed_ = distributed.get();
    optimizer_ = std::move(distributed);
    // overlap_param_gather: each module of the next forward waits for its weights' gather alone.
    if (cfg.overlap_param_gather)
      model_.set_param_gate([d = distributed_](const nn::ParameterList& params) { d->wait_for(params); });
  } else {
    optimizer_ = std::make_unique<optim::AdamW>(*buffer_, adamw);
  }
  pipeline::validate(schedule_);
  if (reduces() && cfg.overlap_grad_reduce && pp_.size() == 1) buffer_->on_bucket_ready([this](size_t b) { reduce_bucket(b); });
  // Without tensor parallelism the norm reads the whole buffer (or the owned shards), as plain and
  // distributed AdamW always have; with it, each global element once.
  // Megatron's embedding group: the two stages holding a copy of the tied word embedding (every
  // pipeline rank takes part in the split). The last stage's copy is left out of the norm: the
  // first stage counts its elements.
  embedding_group_ = model_.embedding_group_weight();
  const models::StageLayout& layout = model_.stage_layout();
  if (model_.config().tie_embeddings && layout.holder(-1) != layout.holder(model_.config().num_layers))
    embedding_comm_ = pp_.split(embedding_group_ ? 0 : 1, pp_.rank(), "embedding");
  const bool copy = embedding_group_ && layout.holder(-1) != layout.rank();
  // DualPipe: the stages r and p-1-r hold the same two model chunks, one copy each; their
  // gradients are summed (every element: their buffers are laid out alike) and the norm counts
  // each chunk on its primary's rank.
  if (schedule_.copies > 1) {
    const int r = pp_.rank(), mirror = pp_.size() - 1 - r;
    copies_ = pp_.split(std::min(r, mirror), r, "copies");
  }
  std::vector<nn::ElementRange> counted, experts;
  const nn::ParameterList& params = model_.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    nn::Parameter* p = params[i];
    if (nn::has_shared_grads(*p)) shared_grads_.push_back(p);
    if (copy && p == embedding_group_) continue;
    if (copies_ && !layout.primary(layout.chunk_of(model_.position(i)))) continue;
    auto& into = experts_apart && p->shard.group == nn::ParallelGroup::Expert ? experts : counted;
    for (const auto& [offset, n] : nn::counted_elements(*p, tp)) into.push_back({buffer_->offset_of(*p) + offset, n});
  }
  const auto by_offset = [](const auto& a, const auto& b) { return a.offset < b.offset; };
  std::sort(counted.begin(), counted.end(), by_offset);
  std::sort(experts.begin(), experts.end(), by_offset);
  const std::vector<nn::ElementRange> all = {{0, buffer_->grads().numel()}};
  const std::vector<nn::ElementRange>& mine = distributed_ ? distributed_->owned() : all;
  norm_ranges_ = tp.active() || copy || ep.active() || copies_ ? nn::intersect(counted, mine) : mine;
  expert_norm_ranges_ = nn::intersect(experts, mine);
  if (const auto scaling = loss_scaler_config(cfg)) scaler_.emplace(*scaling);
  if (cfg.optimizer_post_validation) undo_ = std::make_unique<StepUndo>(*buffer_, *optimizer_);
}

void TrainingStep::reduce_bucket(size_t bucket) {
  if (distributed_) {
    reductions_.push_back(distributed_->reduce_scatter_grads(bucket));
    return;
  }
  const nn::GradBucket& b = buffer_->buckets().at(bucket);
  // Each expert-parallel rank computed its own experts' gradients from the whole group's tokens:
  // only the ranks holding the same experts sum them.
  parallel::Communicator& group = b.expert ? edp_ : dp_;
  if (group.size() == 1) return;
  reductions_.push_back(group.all_reduce_async(
      buffer_->grads().window(b.offset, {b.numel}, "grad_bucket_" + std::to_string(bucket)), parallel::ReduceOp::Sum));
}

void TrainingStep::wait_reductions() {
  for (auto& work : reductions_) work->wait();
  reductions_.clear();
}

double TrainingStep::finish_reductions() {
  const auto t0 = std::chrono::steady_clock::now();
  // The tied embedding's two copies first, on each data-parallel rank's own gradients, so the
  // data-parallel reduction (a reduce-scatter over each stage's own buffer layout with the
  // distributed optimizer) sees the summed gradient like one process's (sums commute).
  if (embedding_group_) embedding_comm_->all_reduce(embedding_group_->grad);
  if (reduces() && (!cfg_.overlap_grad_reduce || pp_.size() > 1))
    for (size_t b = 0; b < buffer_->buckets().size(); ++b) reduce_bucket(b);
  wait_reductions();
  // Sums commute: adding the tensor-parallel parts after the data-parallel sum gives the same
  // gradient (with the distributed optimizer, on the shard this rank owns: its tensor-parallel
  // peers own the same elements of their identical buffers).
  for (nn::Parameter* p : shared_grads_) nn::sum_shared_grads(*p, model_.tensor_parallel());
  // DualPipe: each copy saw half the micro-batches (with the distributed optimizer, the pair owns
  // the same shards of its identical buffers: only those hold the reduced gradients).
  if (copies_ && !distributed_) copies_->all_reduce(buffer_->grads());
  if (copies_ && distributed_)
    for (const nn::ElementRange& r : distributed_->owned())
      copies_->all_reduce(buffer_->grads().window(r.offset, {r.numel}, "grad_shard"));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double TrainingStep::grad_norm() const {
  const auto squares = [&](const std::vector<nn::ElementRange>& ranges) {
    std::vector<Tensor> parts;
    for (const nn::ElementRange& r : ranges) parts.push_back(buffer_->grads().window(r.offset, {r.numel}, "grad_norm"));
    return optim::sum_of_squares(parts);
  };
  double sum = squares(norm_ranges_);
  if (distributed_ && dp_.size() > 1) sum = dp_.all_reduce_scalar(sum);  // each rank holds its shards' sums
  const nn::TensorParallel& tp = model_.tensor_parallel();
  if (tp.active()) sum = tp.group->all_reduce_scalar(sum);
  // Each ep rank holds its own experts, whole, alike on its expert-data-parallel peers.
  double experts = squares(expert_norm_ranges_);
  if (distributed_ && edp_.size() > 1) experts = edp_.all_reduce_scalar(experts);  // shards over edp
  const nn::ExpertParallel& ep = model_.expert_parallel();
  sum += ep.active() ? ep.group->all_reduce_scalar(experts) : experts;
  if (pp_.size() > 1) sum = pp_.all_reduce_scalar(sum);  // each stage holds its own layers
  return std::sqrt(sum);
}

void TrainingStep::begin_fp8_step() {
  const std::vector<fp8::LinearQuantizer*> quantizers = model_.fp8_quantizers();
  std::vector<fp8::DelayedScaling*> states;
  for (fp8::LinearQuantizer* q : quantizers)
    for (fp8::DelayedScaling* s : q->delayed_states()) states.push_back(s);
  if (states.empty()) return;
  // Every rank must quantise with the same scales (TE reduces amaxes over the tensor- and
  // data-parallel groups; a layer lives on one pipeline stage, so not over the pipeline group): max
  // of the newest slots, NaN carried as inf (MPI's max of NaN is unspecified; either keeps the
  // previous scale).
  const int64_t n = static_cast<int64_t>(states.size());
  Tensor amax = Tensor::empty({n}, DType::F32, MemCategory::Workspace, "fp8_amax");
  for (int64_t i = 0; i < n; ++i) {
    const float a = states[static_cast<size_t>(i)]->newest_amax();
    amax.data<float>()[i] = std::isnan(a) ? std::numeric_limits<float>::infinity() : a;
  }
  if (dp_.size() > 1) dp_.all_reduce(amax, parallel::ReduceOp::Max);
  if (const nn::TensorParallel& tp = model_.tensor_parallel(); tp.active()) tp.group->all_reduce(amax, parallel::ReduceOp::Max);
  for (int64_t i = 0; i < n; ++i) states[static_cast<size_t>(i)]->set_newest_amax(amax.data<float>()[i]);
  for (fp8::LinearQuantizer* q : quantizers) q->next_step();
}

TrainingStep::~TrainingStep() { model_.set_param_gate(nullptr); }

TrainingStep::Result TrainingStep::forward_backward(int64_t step, int64_t first_sample, double lr) {
  const auto t0 = std::chrono::steady_clock::now();
  const double tp_wait0 = parallel::tensor_parallel_wait_seconds();
  const double gather_wait0 = distributed_ ? distributed_->gather_wait_seconds() : 0.0;
  const int64_t mbs = cfg_.micro_batch_size;
  // The main weights changed since: optimizer step, resume, rewind. Weights still being gathered
  // are refreshed as they land (the gate).
  if (!distributed_ || !distributed_->weights_in_flight()) model_.refresh_compute_weights();
  begin_fp8_step();
  buffer_->begin_step(schedule_.microbatches / schedule_.copies);  // a copy runs its own micro-batches
  model_.begin_moe_step();
  model_.begin_mtp_step();
  if (!loader_ || loader_position_ != first_sample) {
    loader_.reset();  // stop the old workers before the new loader starts its own
    loader_ = std::make_unique<data::DataLoader>(
        train_, data::DataLoaderOptions{mbs, dp_.rank(), dp_.size(), first_sample, static_cast<int>(cfg_.num_workers)});
    loader_position_ = first_sample;
  }
  TrainingStage stage(
      model_,
      [&](data::Batch& batch) {
        if (!loader_->next(batch)) fail("training data exhausted at sample ", loader_position_);
        loader_position_ += mbs * dp_.size();  // one micro-batch on every data-parallel rank
      },
      schedule_.microbatches, false, dp_.size(), {&schedule_, &pp_},
      scaler_ ? static_cast<float>(scaler_->scale()) : 1.0f);
  reductions_.clear();
  try {
    pipeline::execute(schedule_.ops.at(static_cast<size_t>(pp_.rank())), stage, op_times_);
    stage.finish();
    optimizer_->wait_for_weights();  // a bucket no module gated (none should be): landed before the update
  } catch (...) {
    // The buckets in flight still point into the gradient and weight buffers: let them land
    // before unwinding.
    wait_reductions();
    optimizer_->wait_for_weights();
    throw;
  }
  buffer_->end_step();
  // Blocked on communication: the tensor-parallel collectives inside forward and backward, the
  // overlapped weight gathers the forward waited for, then the gradient reductions.
  const double comm_wait = parallel::tensor_parallel_wait_seconds() - tp_wait0 +
                           (distributed_ ? distributed_->gather_wait_seconds() - gather_wait0 : 0.0) +
                           finish_reductions();
  const double loss_scale = scaler_ ? scaler_->scale() : 0.0;
  if (scaler_) unscale_gradients(loss_scale);
  if (undo_) {  // post-validation: step now, while later stages may still be running their last ops
    undo_->capture(*optimizer_);
    optimizer_->step(lr, 1.0);
  }
  double loss = stage.mean_loss();
  if (pp_.size() > 1) loss = pp_.all_reduce_scalar(loss);  // the last stage's; the others add 0
  if (dp_.size() > 1) loss = dp_.all_reduce_scalar(loss) / static_cast<double>(dp_.size());
  if (hook_) hook_(step, buffer_->grads(), loss);
  double grad_norm = this->grad_norm();  // the tensor-parallel group's: non-finite on every member if on one
  // Without the distributed optimizer the reduced gradients are the same on every data-parallel
  // rank, unless something (a fault) touched one rank's after the reduction: one rank's non-finite
  // norm is everyone's. (The distributed optimizer's norm is already summed over the group.)
  // The pipeline stages' norms are summed (one NaN is everyone's), but a fault may touch one
  // stage's loss after.
  const auto agree = [&](parallel::Communicator& group) {
    if (group.all_reduce_scalar(std::isfinite(grad_norm) ? 0.0 : 1.0, parallel::ReduceOp::Max) > 0)
      grad_norm = std::numeric_limits<double>::quiet_NaN();
  };
  if (!distributed_ && dp_.size() > 1) agree(dp_);
  if (pp_.size() > 1) agree(pp_);
  // The norm is the same on every rank now, so every rank's scaler takes the same decision.
  const bool skipped = scaler_ && scaler_->update(std::isfinite(grad_norm));
  // The eager step stands where the update would have been the same: a finite norm clipping leaves
  // alone (every rank decides alike, as the norm is the same everywhere).
  const bool updated =
      undo_ && !skipped && std::isfinite(grad_norm) && optim::clip_coefficient(grad_norm, cfg_.clip_grad) == 1.0;
  if (undo_ && !updated) undo_->undo(*optimizer_);
  return {loss,      grad_norm,  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
          comm_wait, model_.moe_step_stats(), loss_scale, skipped, updated, model_.mtp_step_losses()};
}

void TrainingStep::unscale_gradients(double loss_scale) {
  // The scale is a power of two under dynamic scaling (halved and doubled from one), so dividing
  // the fp32 main grads by it is exact.
  const Tensor& g = buffer_->grads();
  float* p = g.data<float>();
  const auto inv = static_cast<float>(1.0 / loss_scale);
  const int64_t n = g.numel();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] *= inv;
}

void TrainingStep::update(double lr, const Result& r) {
  if (!r.updated && std::isfinite(r.grad_norm)) optimizer_->step(lr, optim::clip_coefficient(r.grad_norm, cfg_.clip_grad));
  model_.update_moe_expert_bias({&dp_});  // a layer's loads come from its stage alone
}

}  // namespace megaton::train
