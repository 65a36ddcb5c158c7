// The training loop: config -> model, optimizer, data, schedule; runs steps with gradient
// accumulation, logs metrics, evaluates, writes checkpoints (RUN/checkpoints/step_N: HF weights,
// optimizer state, state.json, manifest) and resumes from them bit for bit; optionally rewinds
// past NaN / spiking steps; exports the final model in HF format. Under mpirun every rank runs
// one Trainer: each trains on its data-parallel slice of every batch, and rank 0 alone prints,
// writes metrics, checkpoints and the final export.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "megaton/data/data_loader.h"
#include "megaton/models/transformer_model.h"
#include "megaton/optim/adamw.h"
#include "megaton/optim/lr_schedule.h"
#include "megaton/parallel/process_groups.h"
#include "megaton/train/anomaly_detector.h"
#include "megaton/train/checkpoint_manager.h"
#include "megaton/train/fault_injection.h"
#include "megaton/train/run_log.h"
#include "megaton/train/state_snapshot.h"
#include "megaton/train/train_config.h"
#include "megaton/train/training_data.h"
#include "megaton/train/training_step.h"
#include "megaton/train/train_state.h"

namespace megaton::train {

struct TrainSummary {
  int64_t steps = 0;
  double final_loss = 0;      // training loss of the last step
  double final_val_loss = -1; // -1 when there is no validation data (or training exited early)
  double tokens_per_s = 0;    // median over logged steps
  std::string sample;         // generated text (when sample.tokens > 0)
  bool stopped = false;       // stopped by SIGINT / SIGTERM after writing a checkpoint
};

struct RunOptions {
  // "": a fresh run (an error if the run directory already holds checkpoints); "auto": the newest
  // valid checkpoint of this run directory, or a fresh start if there is none; otherwise a
  // checkpoint directory or a checkpoints directory to take the newest valid one from.
  std::string resume;
  // --overwrite: a fresh run may start in a run directory holding an earlier run's results (which
  // it removes), and `--resume auto` starts over when no checkpoint passes verification.
  bool overwrite = false;
  std::vector<std::string> inject;  // fault injection specs, see fault_injection.h
};

class Trainer {
 public:
  // Opens the data, builds the model and restores the checkpoint to resume from; every error in
  // config, data, checkpoint or run directory surfaces here, before anything is written to it.
  explicit Trainer(TrainConfig config, RunOptions options = {});
  // Trains to train_iters. A non-finite loss or gradient that cannot be rewound, non-finite weights
  // about to be saved and a non-finite final validation loss are errors that leave the last good
  // checkpoint and final model in place. SIGINT / SIGTERM (on any rank) stop every rank after the
  // same step, with a checkpoint (summary.stopped).
  TrainSummary run();

 private:
  void check_before_start(const RunOptions& options);
  void rewind(int64_t step, const std::string& reason, int64_t first_sample);
  [[noreturn]] void diverged(int64_t step, const std::string& reason, const TrainingStep::Result& r);
  // A checkpoint of the current state, refused (an error) when the weights are not finite.
  void save_checkpoint();
  void check_finite_weights(const std::string& what);
  void export_final_model(models::TransformerModel& final_model);
  double validation_loss();
  // logging.trace: RUN/trace.json from every rank's timed ops (collective; rank 0 writes).
  void write_trace() const;

  TrainConfig cfg_;
  parallel::Communicator& world_;
  bool primary_;  // rank 0: prints and writes
  std::unique_ptr<parallel::ProcessGroups> groups_;
  TrainingData data_;
  bool resuming_ = false;  // --resume given: metrics.jsonl continues rather than starts afresh
  bool clear_on_start_ = false;  // --overwrite and not resumed: remove the earlier run's results first
  std::unique_ptr<models::TransformerModel> model_;
  // Forward, backward and update over the model's flat buffers (declared after model_: its buffer
  // unhooks the model's parameters when destroyed, so it must go first).
  std::unique_ptr<TrainingStep> step_;
  optim::Optimizer* optimizer_ = nullptr;  // step_'s: AdamW, or the distributed optimizer
  optim::LRSchedule schedule_;
  std::unique_ptr<RunLog> log_;
  AnomalyDetector detector_;
  FaultInjector faults_;
  TrainProgress progress_;
  CheckpointManager checkpoints_;
  double peak_gflops_ = 0;
  pipeline::OpTimes op_times_;  // logging.trace: every schedule op this rank ran
};

}  // namespace megaton::train
