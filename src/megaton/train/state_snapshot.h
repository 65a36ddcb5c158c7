// A copy of this rank's training state (its weights, AdamW moments, FP8 scaling state, progress)
// in host buffers allocated once and reused by every capture. It is both the in-memory rewind
// point and the source this rank's part of a checkpoint is written from on the writer thread while
// training moves on, so a step pays only for copies. Weights and moments are held in this rank's
// local shapes (its tensor-parallel shards, its pipeline stage's parameters); with the distributed
// optimizer, capturing gathers the data-parallel group's moment shards (every rank of the group
// must capture together) and restoring takes each rank's owned elements back.
//
// Checkpoints are sharded (ckpt/sharded_checkpoint.h): every rank writes the pieces of the global,
// layout-free tensors it holds and no lower rank holds (data-parallel replicas and replicated
// tensor-parallel pieces are written once), named "model/<parameter>", "optim/<parameter>.<moment>"
// and "fp8/<state>"; rank 0 adds config.json (the model, HF's keys) and state.json. Loading reads
// each rank's pieces of every tensor from whichever files hold them, so a checkpoint written at
// one tp / pp / dp layout loads at another.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "megaton/models/transformer_model.h"
#include "megaton/optim/optimizer.h"
#include "megaton/train/fp8_state.h"
#include "megaton/train/train_state.h"

namespace megaton::train {

// Which of its pieces a rank writes into a checkpoint: the replicated model's (and the optimizer's)
// when it is in the first data-parallel replica; the routed experts', split over expert
// parallelism, when it is the first of the ranks holding the same experts (expert-data-parallel
// rank 0). Without expert parallelism the two agree.
struct WriterRole {
  bool dense = true;
  bool experts = true;
};

class StateSnapshot {
 public:
  // model: the live model; it must outlive the snapshot.
  StateSnapshot(const models::TransformerModel& model, const optim::Optimizer& optimizer);

  void capture(const models::TransformerModel& model, const optim::Optimizer& optimizer, const TrainProgress& progress,
               const TrainConfig& cfg);
  void restore(models::TransformerModel& model, optim::Optimizer& optimizer) const;
  const TrainProgress& progress() const { return progress_; }

  // This rank's files of checkpoint directory DIR, from the buffers: its shard (the pieces it is
  // the lowest rank to hold, of the kinds `role` gives it) and, on world rank 0, config.json and
  // state.json. Rerunnable.
  void write(const std::string& dir, int world_rank, WriterRole role) const;

 private:
  const models::TransformerModel& model_;
  std::vector<Tensor> values_;  // model_.parameters()' values, in that order
  std::vector<std::pair<std::string, Tensor>> moments_;  // the optimizer's state, its order and local shapes
  std::vector<const nn::Parameter*> moment_params_;      // the parameter each moment belongs to
  int64_t optimizer_steps_ = 0;
  TrainProgress progress_;
  nlohmann::json state_;  // state.json as of the capture
  Fp8StateSnapshot fp8_;
};

// Loads sharded checkpoint DIR (already verified against its manifest) into this rank's model and
// optimizer and returns its progress; errors name the file or tensor at fault.
TrainProgress load_checkpoint(const std::string& dir, models::TransformerModel& model, optim::Optimizer& optimizer,
                              const TrainConfig& cfg);

// The whole model of sharded checkpoint DIR (its config.json and every "model/" tensor), as one
// process holds it: what `megaton convert` writes as an HF folder.
std::unique_ptr<models::TransformerModel> load_checkpoint_model(const std::string& dir);

}  // namespace megaton::train
