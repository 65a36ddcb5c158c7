// The FP8 delayed-scaling state of a model (every FP8 linear's input / weight / grad-output scale
// and amax history) as host tensors: part of the rewind snapshot and of each checkpoint
// (fp8_state.safetensors), so a resumed or rewound delayed-scaling run quantises with the very
// scales the uninterrupted run would, bit for bit. The training step reduces the amaxes over
// every parallel group, so each rank holds the same state and rank 0's copy stands for all.
// Recipes without delayed scaling have no state (and write no file).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "megaton/models/transformer_model.h"

namespace megaton::train {

class Fp8StateSnapshot {
 public:
  explicit Fp8StateSnapshot(const models::TransformerModel& model);

  void capture(const models::TransformerModel& model);
  void restore(models::TransformerModel& model) const;
  // DIR/fp8_state.safetensors: one f32 tensor per state, [scale, history oldest .. newest].
  void write(const std::string& dir) const;

 private:
  std::vector<std::pair<std::string, Tensor>> states_;
};

// Restores the model's delayed-scaling state from checkpoint DIR. A checkpoint without the file
// (written without delayed scaling) leaves the histories fresh, with a warning; a state missing
// from the file, an extra one, or another history length is an error naming the file.
void load_fp8_state(const std::string& dir, models::TransformerModel& model);

}  // namespace megaton::train
