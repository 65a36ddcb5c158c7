// A copy of the training state (weights, AdamW moments, progress) in host buffers allocated once
// and reused by every capture. It is both the in-memory rewind point and the source a checkpoint
// is written from on the writer thread while training moves on, so a step pays only for copies.
// The optimizer part is the optimizer's full, layout-free state (optim::Optimizer): with the
// distributed optimizer, capturing gathers every rank's shard (every rank of the group must
// capture together) and restoring copies each rank's owned elements back. Weights and moments are
// held as the global tensors whatever the tensor-parallel layout (gathered from the shards on
// capture, sliced on restore; collective over the tensor-parallel group), so a checkpoint written
// at one tp loads at another.
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
  std::vector<std::pair<std::string, Tensor>> moments_;  // the optimizer's full state, global shapes
  // The same in the live model's local shapes (the very tensors of moments_ where a parameter is
  // whole), and the parameter each belongs to.
  std::vector<std::pair<std::string, Tensor>> local_moments_;
  std::vector<const nn::Parameter*> moment_params_;
  nn::TensorParallel tp_;
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
