#include "megaton/train/checkpoint_manager.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "megaton/ckpt/checkpoint_dir.h"

namespace megaton::train {

namespace fs = std::filesystem;

namespace {
// How long rank 0 waits for the other ranks' shards of a checkpoint: they write theirs at the
// same time as it does, so only a rank that hangs (a dead one takes the whole job down) runs out.
constexpr double kShardWaitSeconds = 600;
}  // namespace

CheckpointManager::CheckpointManager(const TrainConfig& cfg, FaultInjector& faults, parallel::Communicator& world)
    : cfg_(cfg), faults_(faults), world_(world), writes_(world.rank() == 0), writer_(cfg.async_save, static_cast<int>(cfg.write_attempts)) {}

std::string CheckpointManager::checkpoints_dir() const { return (fs::path(cfg_.run_dir) / "checkpoints").string(); }

std::optional<TrainProgress> CheckpointManager::resume(const std::string& from, bool start_over,
                                                       models::TransformerModel& model, optim::Optimizer& optimizer) {
  if (from.empty()) return std::nullopt;
  const std::string root = checkpoints_dir();
  const bool own = from == "auto";
  // Rank 0 verifies first and moves this run's rejected checkpoints aside; the other ranks then
  // find the same newest valid one among what is left.
  if (!writes_) world_.barrier();
  auto dir = own && !fs::is_directory(root)
                 ? std::nullopt
                 : ckpt::find_valid_checkpoint(own ? root : from, [&](const std::string& rejected, const std::string& why) {
                     std::string moved;
                     if (writes_ && fs::path(rejected).parent_path() == fs::path(root)) moved = ckpt::move_aside(rejected);
                     std::fprintf(stderr, "warning: checkpoint rejected: %s%s; falling back to an older one\n",
                                  why.c_str(), moved.empty() ? "" : ("; moved aside to " + moved).c_str());
                     rejected_.emplace_back(why, moved);
                   });
  if (writes_) world_.barrier();
  if (!dir) {
    if (!own) fail("--resume ", from, ": no valid checkpoint there");
    const std::vector<std::string> aside = ckpt::list_moved_aside(root);
    if (!aside.empty() && !start_over)
      fail("--resume auto: no checkpoint in ", root, " passes verification (", aside.size(), " moved aside, e.g. ",
           aside.front(), "); pass --overwrite to start over from step 0, or --resume PATH to load another checkpoint");
    if (fs::exists(fs::path(cfg_.run_dir) / "final") && !start_over)
      fail("--resume auto: '", cfg_.run_dir, "' holds a finished run (final/) but no checkpoint to continue it from; "
           "pass --overwrite to train it again from step 0, or choose another logging.run_dir");
    if (fs::is_directory(root)) std::fprintf(stderr, "warning: no valid checkpoint in %s; starting from step 0\n", root.c_str());
    return std::nullopt;
  }
  TrainProgress progress = load_checkpoint(*dir, model, optimizer, cfg_);
  resumed_from_ = newest_ = *dir;
  resumed_step_ = progress.step;
  resumed_samples_ = progress.consumed_samples;
  last_saved_step_ = progress.step;
  return progress;
}

std::string CheckpointManager::newest_checkpoint() const {
  if (!newest_.empty()) return "the newest checkpoint is " + newest_;
  return cfg_.save_interval > 0 ? "no checkpoint was written yet"
                                : "no checkpoint was written (logging.save_interval is 0)";
}

void CheckpointManager::start(MetricsLog& metrics, const models::TransformerModel& model,
                              const optim::Optimizer& optimizer, WriterRole role) {
  metrics_ = &metrics;
  role_ = role;
  // Checkpoint buffers up front: the first save then stalls no longer than the others, and a
  // machine short of memory for them fails now rather than at the first save. Every rank has them:
  // every rank captures (a distributed optimizer's state is gathered by all of its ranks).
  if (cfg_.save_interval > 0 || cfg_.exit_interval > 0)
    save_buffers_ = std::make_unique<StateSnapshot>(model, optimizer);
  if (!writes_) return;
  for (const std::string& path : ckpt::remove_torn_checkpoints(checkpoints_dir())) {
    std::printf("removed %s (a checkpoint whose writing was interrupted)\n", path.c_str());
    metrics.write({{"event", "torn_checkpoint_removed"}, {"path", path}, {"time", unix_time()}});
  }
  for (const auto& [why, moved] : rejected_) {
    nlohmann::json rec = {{"event", "checkpoint_rejected"}, {"reason", why}, {"time", unix_time()}};
    if (!moved.empty()) rec["moved_to"] = moved;
    metrics.write(rec);
  }
  if (!resumed_from_.empty()) {
    std::printf("resumed from %s at step %ld (%ld samples consumed)\n", resumed_from_.c_str(), resumed_step_,
                resumed_samples_);
    metrics.write({{"event", "resume"},
                   {"step", resumed_step_},
                   {"checkpoint", resumed_from_},
                   {"consumed_samples", resumed_samples_},
                   {"time", unix_time()}});
  }
}

void CheckpointManager::save(const models::TransformerModel& model, const optim::Optimizer& optimizer,
                             const TrainProgress& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  writer_.wait();  // at most one save in flight: its buffers are free again once it is written
  log_finished_writes();
  // A stop signal saves without checkpointing being on: its buffers are allocated then.
  if (!save_buffers_) save_buffers_ = std::make_unique<StateSnapshot>(model, optimizer);
  // On every rank: capturing a distributed optimizer's state is collective.
  save_buffers_->capture(model, optimizer, progress, cfg_);
  const int64_t step = progress.step;
  const std::string name = ckpt::checkpoint_name(step);
  // Every rank writes its shard into the directory rank 0 has just made (afresh: a leftover of an
  // interrupted save of this step is cleared first, before any rank writes into it).
  if (writes_) ckpt::prepare_checkpoint(checkpoints_dir(), step);
  world_.barrier();
  const std::string dir = ckpt::temporary_checkpoint_dir(checkpoints_dir(), step);
  pending_saves_[name] = {{"event", "checkpoint"},
                          {"step", step},
                          {"path", (fs::path(checkpoints_dir()) / name).string()},
                          {"async", cfg_.async_save}};
  writer_.submit(name, [this, step, dir] {
    if (faults_.save_delay_s() > 0) std::this_thread::sleep_for(std::chrono::duration<double>(faults_.save_delay_s()));
    if (faults_.fire(Fault::FailSave, step)) fail("injected fault fail@save: cannot write ", dir);
    save_buffers_->write(dir, world_.rank(), role_);
    if (!writes_) return;
    if (faults_.fire(Fault::CrashInSave, step)) FaultInjector::crash("crash@save while writing " + dir);
    // The other ranks write theirs at the same time; a rank that died takes the job down with it.
    const std::vector<ckpt::FileDigest> shards = ckpt::merge_shard_indexes(dir, world_.size(), kShardWaitSeconds);
    ckpt::finish_checkpoint(checkpoints_dir(), step, shards, cfg_.keep_last);
  });
  // What the step paid: the copy, plus the whole write when saving synchronously.
  pending_saves_[name]["stall_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  last_saved_step_ = step;
  log_finished_writes();
}

void CheckpointManager::log_finished_writes() {
  for (const ckpt::WriteReport& r : writer_.take_finished()) {
    nlohmann::json rec = std::move(pending_saves_.at(r.what));
    newest_ = rec["path"].get<std::string>();
    pending_saves_.erase(r.what);
    rec["write_start"] = r.start_time;
    rec["write_end"] = r.end_time;
    rec["attempts"] = r.attempts;
    if (!writes_) continue;  // rank 0 reports every rank's save (it finishes last)
    if (metrics_) metrics_->write(rec);
    std::printf("checkpoint %s saved (write %.2f s%s, step stalled %.3f s)\n", rec["path"].get<std::string>().c_str(),
                r.end_time - r.start_time, cfg_.async_save ? " in the background" : "", rec["stall_s"].get<double>());
    std::fflush(stdout);
  }
}

void CheckpointManager::finish() {
  writer_.wait();
  log_finished_writes();
}

void CheckpointManager::keep_rewind_point(const models::TransformerModel& model, const optim::Optimizer& optimizer,
                                          const TrainProgress& progress) {
  if (!cfg_.rewind || cfg_.snapshot_interval <= 0) return;
  if (rewind_point_ &&
      (progress.step % cfg_.snapshot_interval != 0 || rewind_point_->progress().step == progress.step))
    return;
  if (!rewind_point_) rewind_point_ = std::make_unique<StateSnapshot>(model, optimizer);
  rewind_point_->capture(model, optimizer, progress, cfg_);
}

std::pair<TrainProgress, std::string> CheckpointManager::restore_rewind_point(const std::string& why,
                                                                              models::TransformerModel& model,
                                                                              optim::Optimizer& optimizer) {
  if (rewind_point_) {
    rewind_point_->restore(model, optimizer);
    return {rewind_point_->progress(), "memory"};
  }
  finish();  // the newest checkpoint may still be in flight
  world_.barrier();  // ... on rank 0: every rank must then find the same newest one
  auto dir = ckpt::find_valid_checkpoint(checkpoints_dir(), [&](const std::string& rejected, const std::string& reason) {
    // Rank 0 moves it aside; every rank then passes over it (moved or not, it fails verification).
    const std::string moved = writes_ ? ckpt::move_aside(rejected) : "";
    std::fprintf(stderr, "warning: checkpoint rejected: %s%s; falling back to an older one\n", reason.c_str(),
                 moved.empty() ? "" : ("; moved aside to " + moved).c_str());
    if (metrics_ && !moved.empty())
      metrics_->write({{"event", "checkpoint_rejected"}, {"reason", reason}, {"moved_to", moved}, {"time", unix_time()}});
  });
  if (!dir) fail(why, "; no valid checkpoint in ", checkpoints_dir(), " to rewind to");
  return {load_checkpoint(*dir, model, optimizer, cfg_), *dir};
}

}  // namespace megaton::train
