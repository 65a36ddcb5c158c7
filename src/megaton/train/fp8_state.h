// The FP8 delayed-scaling state of a model (every FP8 linear's input / weight / grad-output scale
// and amax history) as host tensors: part of the rewind snapshot and of each checkpoint
// (fp8_state.safetensors), so a resumed or rewound delayed-scaling run quantises with the very
// scales the uninterrupted run would, bit for bit. The training step reduces the amaxes over the
// data- and tensor-parallel groups, so those ranks hold the same state; under pipeline parallelism
// each stage holds its layers' alone, and a capture sums the stages' (each state lives on one
// stage, the others add zeros) so that every rank, rank 0 the writer among them, holds the whole
// model's. Recipes without delayed scaling have no state (and write no file).
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "megaton/models/transformer_model.h"

namespace megaton::train {

class Fp8StateSnapshot {
 public:
  // live: this rank's model (its FP8 setting and stage); whole: a whole-model copy of the same
  // config, on which the live model's FP8 setting is repeated to name every stage's states.
  Fp8StateSnapshot(const models::TransformerModel& live, models::TransformerModel& whole);

  // Collective over the live model's pipeline group when it is split into stages.
  void capture(const models::TransformerModel& live);
  void restore(models::TransformerModel& live) const;
  // DIR/fp8_state.safetensors: one f32 tensor per state, [scale, history oldest .. newest].
  void write(const std::string& dir) const;

 private:
  Tensor flat_;  // every state, one after another
  std::vector<std::pair<std::string, Tensor>> states_;  // windows of flat_, the whole model's order
  std::map<std::string, size_t> index_;                 // name -> position in states_
};

// Restores the model's delayed-scaling state from checkpoint DIR (the states of this rank's layers;
// the file holds the whole model's). A checkpoint without the file (written without delayed
// scaling) leaves the histories fresh, with a warning; a state missing from the file or another
// history length is an error naming the file.
void load_fp8_state(const std::string& dir, models::TransformerModel& model);

}  // namespace megaton::train
