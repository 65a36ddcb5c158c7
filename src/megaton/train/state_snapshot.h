// A copy of the training state (weights, AdamW moments, progress) in host buffers allocated once
// and reused by every capture. It is both the in-memory rewind point and the source a checkpoint
// is written from on the writer thread while training moves on, so a step pays only for copies.
// The optimizer part is the optimizer's full, layout-free state (optim::Optimizer): with the
// distributed optimizer, capturing gathers every rank's shard (every rank of the group must
// capture together) and restoring copies each rank's owned elements back. Weights and moments are
// held as the whole model's global tensors whatever the layout: gathered from the tensor-parallel
// shards and, under pipeline parallelism, from the stage holding each parameter on capture (every
// rank holds the whole snapshot; collective over the tensor-parallel and pipeline groups), sliced
// to this rank's pieces on restore. So a checkpoint written at one tp / pp loads at another.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "megaton/models/transformer_model.h"
#include "megaton/optim/optimizer.h"
#include "megaton/train/fp8_state.h"
#include "megaton/train/train_state.h"

namespace megaton::train {

class StateSnapshot {
 public:
  // model: the live model (its config and tensor-parallel layout); it must outlive the snapshot.
  StateSnapshot(const models::TransformerModel& model, const optim::Optimizer& optimizer);

  void capture(const models::TransformerModel& model, const optim::Optimizer& optimizer, const TrainProgress& progress,
               const TrainConfig& cfg);
  void restore(models::TransformerModel& model, optim::Optimizer& optimizer) const;
  const TrainProgress& progress() const { return progress_; }

  // The checkpoint files, from the buffers. The model part is an HF folder (config.json +
  // model.safetensors), loadable by `megaton eval/generate` and transformers as it is.
  void write_model(const std::string& dir);
  // optimizer.safetensors + state.json (+ fp8_state.safetensors under FP8 delayed scaling)
  void write_optimizer_and_state(const std::string& dir) const;

 private:
  models::TransformerModel model_;  // holds the weights, whole (its gradient buffers are released)
  // The index of each of model_'s parameters among the live model's (-1 where another stage holds it).
  std::vector<int64_t> local_params_;
  // The optimizer's full state for the whole model, global shapes, and the index into model_'s
  // parameters each belongs to.
  std::vector<std::pair<std::string, Tensor>> moments_;
  std::vector<size_t> moment_whole_param_;
  // This stage's state in the live model's local shapes, in the optimizer's order (the very tensors
  // of moments_ where a parameter is whole), and where each name is in it.
  std::vector<std::pair<std::string, Tensor>> local_moments_;
  std::map<std::string, size_t> local_moment_index_;
  const nn::Parameter* local_param(const models::TransformerModel& model, size_t i) const;  // of model_'s i-th
  int64_t optimizer_steps_ = 0;
  TrainProgress progress_;
  nlohmann::json state_;  // state.json as of the capture
  Fp8StateSnapshot fp8_;  // the delayed-scaling scales and amax histories (none without them)
};

// Loads checkpoint DIR (already verified against its manifest) into model and optimizer and
// returns its progress; errors name the file at fault.
TrainProgress load_checkpoint(const std::string& dir, models::TransformerModel& model, optim::Optimizer& optimizer,
                              const TrainConfig& cfg);

}  // namespace megaton::train
