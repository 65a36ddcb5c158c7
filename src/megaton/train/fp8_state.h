// The FP8 delayed-scaling state of this rank's model (every FP8 linear's input / weight /
// grad-output scale and amax history) as host tensors: part of the rewind snapshot and of each
// checkpoint, so a resumed or rewound delayed-scaling run quantises with the very scales the
// uninterrupted run would, bit for bit. The training step reduces the amaxes over the data- and
// tensor-parallel groups, so those ranks hold the same state; under pipeline parallelism each
// stage holds its layers' alone. Recipes without delayed scaling have no state.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "megaton/ckpt/sharded_checkpoint.h"
#include "megaton/models/transformer_model.h"

namespace megaton::train {

class Fp8StateSnapshot {
 public:
  explicit Fp8StateSnapshot(const models::TransformerModel& live);

  void capture(const models::TransformerModel& live);
  void restore(models::TransformerModel& live) const;
  // (name, [scale, history oldest .. newest]) per state, f32, in the model's layer order.
  const std::vector<std::pair<std::string, Tensor>>& states() const { return states_; }

 private:
  Tensor flat_;  // every state, one after another
  std::vector<std::pair<std::string, Tensor>> states_;  // windows of flat_
};

// Restores the model's delayed-scaling states from a checkpoint, where state NAME is the tensor
// `prefix` + NAME. A checkpoint without them (written without delayed scaling) leaves the
// histories fresh, with a warning; another history length is an error naming the state.
void load_fp8_state(ckpt::ShardedReader& reader, const std::string& prefix, models::TransformerModel& model);

}  // namespace megaton::train
