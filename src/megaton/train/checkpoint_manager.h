// Everything the trainer can go back to, apart from the training loop: full checkpoints
// (RUN/checkpoints/step_N, captured into reused host buffers and written by the async writer),
// the checkpoint a run resumes from, and the in-memory rewind point with restoring either one
// when a rewind needs it. Each finished write becomes a `checkpoint` record in the metrics.
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "megaton/ckpt/async_writer.h"
#include "megaton/parallel/communicator.h"
#include "megaton/train/fault_injection.h"
#include "megaton/train/metrics_log.h"
#include "megaton/train/state_snapshot.h"

namespace megaton::train {

class CheckpointManager {
 public:
  // world: every process of the run. Every rank captures each checkpoint (gathering a
  // distributed optimizer's moment shards over its data-parallel group) and writes its shard of it
  // (state_snapshot.h); rank 0 then completes it (metadata, manifest, rename). Every rank reads its
  // own pieces of a checkpoint back.
  CheckpointManager(const TrainConfig& cfg, FaultInjector& faults, parallel::Communicator& world);
  std::string checkpoints_dir() const;

  // --resume: "" starts fresh (whether the run directory may be used is the trainer's check), "auto"
  // the newest valid checkpoint of this run if any, otherwise that checkpoint (or the newest valid
  // one under that directory). Loads it into model and optimizer and returns its progress; nullopt
  // when starting fresh. Runs before anything is written. Checkpoints of this run that fail
  // verification are moved aside (rank 0; reported now and in the metrics). With "auto", a run
  // whose checkpoints all fail verification (or were moved aside before) is an error unless
  // start_over (--overwrite); so is a finished run (final/) with no checkpoint to continue from.
  std::optional<TrainProgress> resume(const std::string& from, bool start_over, models::TransformerModel& model,
                                      optim::Optimizer& optimizer);
  // Opens for business once the metrics file exists: removes torn checkpoints, logs them, the
  // checkpoints resume() rejected and the resume itself; allocates the save buffers when saving is on.
  // role: which of this rank's weights and moments it writes (the first data-parallel and
  // context-parallel replica of each; the other replicas hold the same ones).
  void start(MetricsLog& metrics, const models::TransformerModel& model, const optim::Optimizer& optimizer,
             WriterRole role);

  // A full checkpoint of the current state: the step pays for the copy into the buffers (allocated
  // by start() when logging.save_interval or training.exit_interval ask for saves, else by the first
  // save, which a stop signal asks for);
  // the write runs in the background (or at once when checkpoint.async_save is off).
  void save(const models::TransformerModel& model, const optim::Optimizer& optimizer, const TrainProgress& progress);
  int64_t last_saved_step() const { return last_saved_step_; }
  // Where the newest complete checkpoint of this run is (written, or resumed from), as a phrase for
  // messages that must say where the last good state is.
  std::string newest_checkpoint() const;
  // Logs the writes that finished since the last call.
  void log_finished_writes();
  // Waits for the write in flight (the last save must be on disk before the process may end).
  void finish();

  // Before each step: refreshes the in-memory rewind point every rewind.snapshot_interval steps
  // (when that is 0, a rewind goes back to the newest checkpoint instead).
  void keep_rewind_point(const models::TransformerModel& model, const optim::Optimizer& optimizer,
                         const TrainProgress& progress);
  // Restores the rewind point into model and optimizer and returns its progress and where it came
  // from ("memory" or the checkpoint directory). `why` names the anomaly for the error when there
  // is nothing to go back to.
  std::pair<TrainProgress, std::string> restore_rewind_point(const std::string& why, models::TransformerModel& model,
                                                             optim::Optimizer& optimizer);

 private:
  const TrainConfig& cfg_;
  FaultInjector& faults_;
  parallel::Communicator& world_;
  bool writes_;  // rank 0: completes each checkpoint, owns the checkpoint directory
  WriterRole role_;
  MetricsLog* metrics_ = nullptr;
  std::unique_ptr<StateSnapshot> rewind_point_;  // rewind.snapshot_interval > 0
  std::unique_ptr<StateSnapshot> save_buffers_;  // what the checkpoint writer writes from
  ckpt::AsyncWriter writer_;
  std::map<std::string, nlohmann::json> pending_saves_;  // checkpoint name -> its metrics record so far
  std::string resumed_from_;
  int64_t resumed_step_ = 0, resumed_samples_ = 0;
  std::vector<std::pair<std::string, std::string>> rejected_;  // (reason, moved to), logged once the metrics file is open
  std::string newest_;  // the newest complete checkpoint directory, "" when there is none
  int64_t last_saved_step_ = -1;
};

}  // namespace megaton::train
