#include "megaton/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "megaton/core/threads.h"
#include "megaton/data/tokenizer.h"
#include "megaton/infer/generate.h"
#include "megaton/kernels/sgemm_ceiling.h"
#include "megaton/models/hf_format.h"
#include "megaton/models/parallel_weights.h"
#include "megaton/optim/grad_clip.h"
#include "megaton/pipeline/trace.h"
#include "megaton/train/evaluate.h"
#include "megaton/train/pipeline_layout.h"
#include "megaton/train/run_directory.h"
#include "megaton/train/stop_signal.h"

namespace megaton::train {

namespace fs = std::filesystem;

Trainer::Trainer(TrainConfig config, RunOptions options)
    : cfg_(std::move(config)),
      world_(parallel::world()),
      primary_(world_.rank() == 0),
      detector_(cfg_.rewind_window, cfg_.rewind_zscore),
      faults_(options.inject, cfg_.run_dir, world_.rank(), world_.size()),
      checkpoints_(cfg_, faults_, world_) {
  resolve_parallel_layout(cfg_, world_.size());
  groups_ = std::make_unique<parallel::ProcessGroups>(
      world_, parallel::ParallelSizes{static_cast<int>(cfg_.tensor_model_parallel_size),
                                      static_cast<int>(cfg_.context_parallel_size),
                                      static_cast<int>(cfg_.expert_model_parallel_size),
                                      static_cast<int>(cfg_.pipeline_model_parallel_size)});
  set_num_threads(static_cast<int>(cfg_.threads));
  if (cfg_.rewind && cfg_.snapshot_interval == 0 && cfg_.save_interval == 0)
    fail("config key 'rewind.snapshot_interval' is 0 (rewind to the last checkpoint) but logging.save_interval is 0, "
         "so there would be no checkpoint to rewind to");
  check_run_dir_writable(cfg_.run_dir);
  if (primary_ && options.resume.empty() && !options.overwrite) {
    // A fresh run would replace the metrics, checkpoints and final model of the one there. Rank 0
    // alone looks: the others could see what rank 0 already started writing.
    std::string held;
    for (const std::string& h : previous_results(cfg_.run_dir)) held += (held.empty() ? "" : ", ") + h;
    if (!held.empty())
      fail("config key 'logging.run_dir': '", cfg_.run_dir, "' already holds a run (", held,
           "): pass --resume auto to continue it, --overwrite to start over in its place, or choose another run "
           "directory");
  }
  auto tokenizer = data::make_tokenizer(cfg_.tokenizer);
  if (tokenizer->vocab_size() > cfg_.model.vocab_size)
    fail("config key 'data.tokenizer': tokenizer '", cfg_.tokenizer, "' has ", tokenizer->vocab_size(),
         " ids but the model's vocab_size is ", cfg_.model.vocab_size);
  if (cfg_.sample_tokens > 0) {
    // The sample is generated at the very end; a prompt that cannot fit fails now, not after training.
    const auto prompt = tokenizer->encode(cfg_.sample_prompt.empty() ? "\n" : cfg_.sample_prompt);
    if (static_cast<int64_t>(prompt.size()) >= cfg_.seq_length)
      fail("config key 'sample.prompt': its ", prompt.size(), " tokens leave no room to generate within "
           "training.seq_length ", cfg_.seq_length, " (the positions the model was trained on)");
  }
  data_ = build_training_data(cfg_);
  if (cfg_.sample_tokens > 0 && data_.max_token >= tokenizer->vocab_size())
    // The sample is decoded with this tokenizer: data it cannot have made means the wrong one is named.
    fail("config key 'data.tokenizer': tokenizer '", cfg_.tokenizer, "' has ", tokenizer->vocab_size(),
         " ids but the data holds token id ", data_.max_token, " (the data was tokenized with another tokenizer)");
  if (cfg_.eval_interval > 0 && !data_.valid)
    fail("config key 'logging.eval_interval' is ", cfg_.eval_interval, " but there is no validation data: "
         "data.valid_data_path is empty and data.split '", cfg_.split, "' leaves no documents for validation");
  // This rank's shard of the model over its tensor-parallel group (the whole model at tp 1) and,
  // under pipeline parallelism, of its stage: the layers split into the schedule's model chunks
  // (stages x chunks per rank), of which this rank builds only its own.
  const nn::TensorParallel tp{&groups_->tp(), cfg_.sequence_parallel};
  const nn::ExpertParallel ep{&groups_->ep()};
  models::StageLayout layout = pipeline_layout(cfg_, groups_->pp());
  if (!cfg_.load.empty()) {
    std::unique_ptr<models::TransformerModel> whole = models::load_hf_model(cfg_.load);
    model_ = std::make_unique<models::TransformerModel>(whole->config(), std::move(layout), tp, ep);
    models::copy_weights(*whole, *model_);
  } else {
    model_ = std::make_unique<models::TransformerModel>(cfg_.model, std::move(layout), tp, ep);
    model_->init_weights(static_cast<uint64_t>(cfg_.seed));
  }
  if (cfg_.bf16) model_->set_compute_dtype(DType::BF16);
  if (cfg_.fp16) model_->set_compute_dtype(DType::F16);
  model_->set_recompute(recompute_config(cfg_));
  model_->set_fusion({.bias_activation = cfg_.bias_activation_fusion,
                      .residual_norm = cfg_.residual_norm_fusion,
                      .layernorm_linear = cfg_.layernorm_linear_fusion,
                      .layernorm_mlp = cfg_.layernorm_mlp_fusion});
  if (const auto fp8 = fp8_config(cfg_)) {
    const auto [first, end] = fp8_layer_range(cfg_, model_->config().num_layers);
    model_->enable_fp8(*fp8, first, end);
  }
  step_ = std::make_unique<TrainingStep>(*model_, cfg_, data_.train, groups_->dp(), groups_->pp(), &groups_->edp());
  step_->on_gradients([this](int64_t step, const Tensor& grads, double& loss) { faults_.corrupt_gradients(step, grads, loss); });
  optimizer_ = &step_->optimizer();
  schedule_ = {cfg_.lr, cfg_.min_lr, cfg_.lr_warmup_iters, cfg_.lr_decay_iters,
               optim::lr_decay_style_from_name(cfg_.lr_decay_style)};
  schedule_.lr_at(0);  // validates warmup vs decay steps now, before any file is written
  resuming_ = !options.resume.empty();
  if (auto resumed = checkpoints_.resume(options.resume, options.overwrite, *model_, *optimizer_)) {
    progress_ = *resumed;
    step_->load_loss_scaler_state(progress_.loss_scaler);
  }
  else
    clear_on_start_ = options.overwrite;
  peak_gflops_ = cfg_.peak_tflops > 0 ? cfg_.peak_tflops * 1e3 : kernels::measure_sgemm_gflops();
  log_ = std::make_unique<RunLog>(cfg_, model_->config().flops_per_token(cfg_.seq_length), peak_gflops_, primary_,
                                  &world_);
}

void Trainer::rewind(int64_t step, const std::string& reason, int64_t first_sample) {
  if (progress_.rewinds >= cfg_.max_rewinds) {
    checkpoints_.finish();  // the newest checkpoint, still good, must be complete before the run ends
    fail("step ", step, ": ", reason, "; not rewinding again after ", progress_.rewinds,
         " rewinds (config key 'rewind.max_rewinds'); ", checkpoints_.newest_checkpoint());
  }
  const TrainProgress before = progress_;
  std::string restored_from;
  std::tie(progress_, restored_from) =
      checkpoints_.restore_rewind_point("step " + std::to_string(step) + ": " + reason, *model_, *optimizer_);
  // What the rewinds learned outlives the state they restore.
  progress_.skipped_batches = before.skipped_batches;
  progress_.skipped_batches.push_back(first_sample);
  progress_.rewinds = before.rewinds + 1;
  step_->load_loss_scaler_state(progress_.loss_scaler);
  // Steps up to the anomaly replay exactly as before; the lr is lowered from there on.
  if (cfg_.rewind_lr_steps > 0) {
    progress_.lr_factor = cfg_.rewind_lr_factor;
    progress_.lr_factor_from = step;
    progress_.lr_factor_until = step + cfg_.rewind_lr_steps - 1;
  }
  log_->metrics().write({{"event", "rewind"},
                   {"step", step},
                   {"reason", reason},
                   {"restored_step", progress_.step},
                   {"restored_from", restored_from},
                   {"skipped_batch", {{"step", step}, {"first_sample", first_sample}, {"samples", cfg_.global_batch_size}}},
                   {"skipped_batches", progress_.skipped_batches},
                   {"rewinds", progress_.rewinds},
                   {"time", unix_time()}});
  if (!primary_) return;
  std::printf("step %ld: %s; rewound to step %ld, skipping samples [%ld, %ld) (rewind %ld of at most %ld)\n", step,
              reason.c_str(), progress_.step, first_sample, first_sample + cfg_.global_batch_size, progress_.rewinds,
              cfg_.max_rewinds);
  std::fflush(stdout);
}

void Trainer::diverged(int64_t step, const std::string& reason, const TrainingStep::Result& r) {
  log_->metrics().write(
      {{"event", "diverged"}, {"step", step}, {"reason", reason}, {"loss", r.loss}, {"grad_norm", r.grad_norm},
       {"time", unix_time()}});
  checkpoints_.finish();
  fail("step ", step, ": ", reason, ": the run diverged and cannot rewind (config key 'rewind.enabled' is false); "
       "stopping before the update; ", checkpoints_.newest_checkpoint());
}

void Trainer::check_finite_weights(const std::string& what) {
  const double norm = optim::global_norm({step_->buffer().weights()});
  // Every rank: each judges its own weights (replicated, or its tensor-parallel shard) and all agree.
  const std::string why = agree_on_anomaly(world_, std::isfinite(norm) ? "" : "the weights are not finite");
  if (why.empty()) return;
  checkpoints_.finish();
  fail("step ", progress_.step, ": ", why, "; not writing ", what, " (it would replace good files); ",
       checkpoints_.newest_checkpoint());
}

void Trainer::save_checkpoint() {
  check_finite_weights("a checkpoint");
  checkpoints_.save(*model_, *optimizer_, progress_);
}

void Trainer::export_final_model(models::TransformerModel& final_model) {
  const fs::path final_dir = fs::path(cfg_.run_dir) / "final";
  const fs::path tmp_dir = fs::path(cfg_.run_dir) / "final.tmp";
  // Retried like a checkpoint write; written aside and renamed, so a failure never leaves a torn
  // final/ (nor removes the one an earlier export of this run left).
  ckpt::AsyncWriter writer(false, static_cast<int>(cfg_.write_attempts));
  try {
    writer.submit("the final model " + final_dir.string(), [&] {
      fs::remove_all(tmp_dir);
      if (faults_.fire(Fault::FailFinal, progress_.step)) fail("injected fault fail@final: cannot write ", tmp_dir.string());
      models::save_hf_model(final_model, tmp_dir.string());
      fs::remove_all(final_dir);
      fs::rename(tmp_dir, final_dir);
    });
  } catch (const Error& e) {
    std::error_code ec;
    fs::remove_all(tmp_dir, ec);
    fail(e.what(), "; ", checkpoints_.newest_checkpoint(),
         checkpoints_.last_saved_step() == progress_.step
             ? ", which holds the trained weights (an HF folder: megaton eval and generate read it)"
             : "");
  }
}

void Trainer::write_trace() const {
  // Every rank's ops as rows of 8 f64 (kind, micro-batch, chunk, F&B's B micro-batch and chunk,
  // start, end, with_weight), padded to the longest list (kind -1), all-gathered.
  constexpr int64_t kFields = 8;
  const auto n = static_cast<int64_t>(op_times_.ops.size());
  const auto most = static_cast<int64_t>(world_.all_reduce_scalar(static_cast<double>(n), parallel::ReduceOp::Max));
  Tensor mine = Tensor::empty({std::max<int64_t>(most, 1) * kFields}, DType::F64, MemCategory::Workspace, "trace_ops");
  double* m = mine.data<double>();
  std::fill(m, m + mine.numel(), -1.0);
  for (int64_t i = 0; i < n; ++i) {
    const pipeline::TimedOp& t = op_times_.ops[static_cast<size_t>(i)];
    const double row[kFields] = {static_cast<double>(t.op.kind), static_cast<double>(t.op.microbatch),
                                 static_cast<double>(t.op.chunk), static_cast<double>(t.op.backward_microbatch),
                                 static_cast<double>(t.op.backward_chunk), t.start, t.end, t.with_weight ? 1.0 : 0.0};
    std::copy(row, row + kFields, m + i * kFields);
  }
  Tensor all = Tensor::empty({world_.size() * mine.numel()}, DType::F64, MemCategory::Workspace, "trace_ops_all");
  world_.all_gather(all, mine);
  if (!primary_) return;
  std::vector<pipeline::TraceRow> rows;
  const parallel::RankLayout& layout = groups_->layout();
  for (int r = 0; r < world_.size(); ++r) {
    const parallel::RankCoords c = layout.coords(r);
    pipeline::TraceRow row{"rank " + std::to_string(r) + " (pp " + std::to_string(c.pp) + ", dp " + std::to_string(c.dp) +
                               ", tp " + std::to_string(c.tp) + ")",
                           {}};
    const double* v = all.data<double>() + r * mine.numel();
    for (int64_t i = 0; i < mine.numel() / kFields && v[i * kFields] >= 0; ++i) {
      const double* f = v + i * kFields;
      row.ops.push_back({{static_cast<pipeline::OpKind>(f[0]), static_cast<int64_t>(f[1]), static_cast<int>(f[2]),
                          static_cast<int64_t>(f[3]), static_cast<int>(f[4])},
                         f[5], f[6], f[7] > 0});
    }
    rows.push_back(std::move(row));
  }
  pipeline::write_chrome_trace((fs::path(cfg_.run_dir) / "trace.json").string(), rows, 1e6,
                               {{"schedule", step_->schedule().name}, {"steps", progress_.step}});
}

double Trainer::validation_loss() {
  optimizer_->wait_for_weights();
  return evaluate(*model_, *data_.valid, cfg_.micro_batch_size,
                  cfg_.eval_iters > 0 ? cfg_.eval_iters * cfg_.micro_batch_size : 0)
      .loss;
}

TrainSummary Trainer::run() {
  const StopSignals stop_signals;  // SIGINT / SIGTERM: stop after the step in progress
  if (primary_) {
    if (clear_on_start_) clear_previous_results(cfg_.run_dir);
    fs::create_directories(cfg_.run_dir);
    std::ofstream resolved(fs::path(cfg_.run_dir) / "config.toml");
    resolved << to_toml(cfg_);
  }
  log_->open(resuming_);
  const bool first_cp = groups_->coords().cp == 0;
  checkpoints_.start(log_->metrics(), *model_, *optimizer_,
                     {.dense = groups_->coords().dp == 0 && first_cp, .experts = groups_->edp().rank() == 0 && first_cp});
  const auto& mc = model_->config();
  const auto parallel_layout = [&] {
    std::string s;
    if (cfg_.tensor_model_parallel_size > 1)
      s += " | tensor parallel " + std::to_string(cfg_.tensor_model_parallel_size) + " ranks" +
           (cfg_.sequence_parallel ? " + sequence parallel" : "") + " (parameters per rank)";
    if (cfg_.pipeline_model_parallel_size > 1)
      s += " | pipeline parallel " + std::to_string(cfg_.pipeline_model_parallel_size) + " stages, schedule '" +
           cfg_.pipeline_schedule + "', " + std::to_string(model_->num_chunks()) + " model chunks";
    if (cfg_.data_parallel_size > 1)
      s += " | data parallel " + std::to_string(cfg_.data_parallel_size) + " ranks" +
           (cfg_.use_distributed_optimizer ? ", distributed optimizer" : "");
    if (cfg_.expert_model_parallel_size > 1)
      s += " | expert parallel " + std::to_string(cfg_.expert_model_parallel_size) + " ranks (" +
           std::to_string(mc.moe.num_moe_experts / cfg_.expert_model_parallel_size) + " of " +
           std::to_string(mc.moe.num_moe_experts) + " experts each), " + mc.moe.moe_token_dispatcher_type +
           " dispatcher";
    if (const std::string r = nn::describe(recompute_config(cfg_)); !r.empty()) s += " | activation recompute " + r;
    return s;
  };
  if (primary_)
    std::printf("model %s: %ld layers, hidden %ld, %ld heads (%ld kv), %.2fM parameters%s | %ld steps of %ld x %ld "
                "tokens | %d threads | sgemm ceiling %.1f GFLOP/s%s\n",
                mc.name.c_str(), mc.num_layers, mc.hidden_size, mc.num_attention_heads, mc.num_query_groups,
                static_cast<double>(nn::count_parameters(model_->parameters())) / 1e6,
                model_->stage_layout().split() ? " on pipeline rank 0" : "", cfg_.train_iters,
                cfg_.global_batch_size, cfg_.seq_length, num_threads(), peak_gflops_,
                parallel_layout().c_str());
  if (cfg_.trace) {
    // One time origin for every rank: their clocks (CLOCK_MONOTONIC) agree on one machine, and the
    // barrier lines them up across machines to its skew.
    world_.barrier();
    op_times_.origin = std::chrono::steady_clock::now();
    step_->time_ops(&op_times_);
  }
  // From here on the allocator's peaks are the training's (not construction's transients): the
  // per-category figures RunLog reports after the first step.
  Allocator::host().reset_peaks();
  TrainSummary summary;
  bool exiting = false;
  std::string stop;  // why the run stops early on a signal ("rank R: SIGTERM" under data parallelism)
  while (progress_.step < cfg_.train_iters && !exiting) {
    const int64_t step = progress_.step + 1;
    if (faults_.fire(Fault::CrashAtStep, step)) FaultInjector::crash("crash@step=" + std::to_string(step));
    if (faults_.fire(Fault::SignalAtStep, step)) std::raise(SIGTERM);
    checkpoints_.keep_rewind_point(*model_, *optimizer_, progress_);
    const int64_t first_sample = progress_.next_batch(cfg_.global_batch_size);
    // The schedule is indexed by the 1-based number of the update being made, so the first
    // update of a warmup already moves the weights. A step whose update is skipped (FP16 overflow)
    // does not advance it: Megatron steps its scheduler only after a successful update, so an
    // overflowing start (~20 halvings from 2^32) leaves the warmup whole for the real updates.
    const double lr = schedule_.lr_at(optimizer_->steps() + 1) * progress_.lr_multiplier(step);
    TrainingStep::Result r = step_->forward_backward(step, first_sample, lr);
    progress_.loss_scaler = step_->loss_scaler_state();
    if (r.skipped) {
      // FP16 overflow: the dynamic loss scaler lowered its scale; the step's batch is consumed
      // without an update, as Megatron does, and not judged an anomaly.
      progress_.step = step;
      progress_.consumed_samples = first_sample + cfg_.global_batch_size;
      log_->step(step, r, 0.0, progress_.consumed_samples);
      continue;
    }
    // Every rank rewinds (or stops), or none: a fault may have touched one rank's loss or gradients alone.
    const std::string why = agree_on_anomaly(world_, cfg_.rewind ? detector_.check(progress_.recent, r.loss, r.grad_norm)
                                                                 : AnomalyDetector::non_finite(r.loss, r.grad_norm));
    if (!why.empty()) {
      if (!cfg_.rewind) diverged(step, why, r);
      rewind(step, why, first_sample);
      continue;
    }
    if (cfg_.rewind) detector_.accept(progress_.recent, r.loss, r.grad_norm);
    const auto update_start = std::chrono::steady_clock::now();
    step_->update(lr, r);
    r.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - update_start).count();  // the whole step
    progress_.step = step;
    progress_.consumed_samples = first_sample + cfg_.global_batch_size;
    log_->step(step, r, lr, progress_.consumed_samples);
    checkpoints_.log_finished_writes();
    if (data_.valid && cfg_.eval_interval > 0 && step % cfg_.eval_interval == 0 && step != cfg_.train_iters) {
      log_->validation(step, validation_loss(), false);
    }
    if (cfg_.save_interval > 0 && step % cfg_.save_interval == 0) save_checkpoint();
    exiting = cfg_.exit_interval > 0 && step % cfg_.exit_interval == 0 && step < cfg_.train_iters;
    // A signal may reach one rank alone (or the ranks at different steps): all stop after the same one.
    stop = agree_on_anomaly(world_, stop_signals.requested());
    if (!stop.empty()) exiting = step < cfg_.train_iters;
  }
  optimizer_->wait_for_weights();  // the last update lands before the export reads it
  if (cfg_.trace) write_trace();
  // The last state is always on disk when checkpointing is on, so a finished run can be extended
  // (--resume auto with more train_iters) and an early exit resumed.
  if ((cfg_.save_interval > 0 || exiting) && checkpoints_.last_saved_step() != progress_.step) save_checkpoint();
  checkpoints_.finish();  // the last save must be complete before the process may end
  summary.steps = progress_.step;
  summary.final_loss = log_->last_loss();
  summary.tokens_per_s = log_->median_tokens_per_s();
  if (exiting) {
    summary.stopped = !stop.empty();
    if (primary_ && summary.stopped) {
      log_->metrics().write({{"event", "stopped"}, {"step", progress_.step}, {"reason", stop}, {"time", unix_time()}});
      std::printf("stopped by a signal (%s) after step %ld; %s; continue with --resume auto\n", stop.c_str(), progress_.step,
                  checkpoints_.newest_checkpoint().c_str());
    } else if (primary_) {
      std::printf("exiting after step %ld (training.exit_interval); continue with --resume auto\n", progress_.step);
    }
    std::fflush(stdout);
    // No rank may end before rank 0's checkpoint is on disk: a launcher ends the job when one rank
    // exits with a non-zero status.
    world_.barrier();
    return summary;
  }
  if (data_.valid) {
    summary.final_val_loss = validation_loss();
    log_->validation(cfg_.train_iters, summary.final_val_loss, true);
    if (!std::isfinite(summary.final_val_loss))
      fail("the final validation loss is ", summary.final_val_loss, ": the model is not exported; ",
           checkpoints_.newest_checkpoint());
  }
  check_finite_weights("the final model");
  // The export and the sample need the whole model: a split one is gathered (by every rank).
  std::unique_ptr<models::TransformerModel> whole;
  if (model_->split()) whole = models::gather_whole_model(*model_);
  models::TransformerModel& final_model = whole ? *whole : *model_;
  if (!primary_) return summary;
  export_final_model(final_model);
  std::printf("model saved to %s\n", (fs::path(cfg_.run_dir) / "final").c_str());
  if (cfg_.sample_tokens > 0) {
    auto tok = data::make_tokenizer(cfg_.tokenizer);
    infer::SamplingOptions opts;
    opts.temperature = cfg_.sample_temperature;
    opts.top_k = 40;
    opts.seed = static_cast<uint64_t>(cfg_.seed);
    opts.max_new_tokens = cfg_.sample_tokens;
    opts.stop_token = tok->eod();
    opts.vocab_size = tok->vocab_size();
    auto prompt = tok->encode(cfg_.sample_prompt.empty() ? "\n" : cfg_.sample_prompt);
    // Positions beyond the training length were never trained (learned position embeddings stay
    // at their init), so the sample stops at seq_length tokens.
    opts.max_new_tokens = std::min<int64_t>(opts.max_new_tokens, cfg_.seq_length - static_cast<int64_t>(prompt.size()));
    auto out = infer::generate(final_model, prompt, opts);
    summary.sample = cfg_.sample_prompt + tok->decode(out);
    std::printf("sample:\n%s\n", summary.sample.c_str());
  }
  return summary;
}

}  // namespace megaton::train
