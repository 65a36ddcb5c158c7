// What the training step, checkpoints and rewind points see of an optimizer: its update, and its
// state as full per-parameter tensors whatever its layout. Plain AdamW (adamw.h) and the
// distributed optimizer (parallel/distributed_optimizer.h, each data-parallel rank holding a shard
// of the state) both implement it, so a checkpoint written by one loads into the other.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "megaton/core/tensor.h"

namespace megaton::optim {

// One tensor of an optimizer's full state, e.g. "<param>.exp_avg" with the parameter's shape.
struct StateTensorSpec {
  std::string name;
  Shape shape;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // One update with learning rate lr; grad_scale multiplies every gradient first (the clipping
  // coefficient). A distributed optimizer's step is collective: every rank of its group calls it.
  virtual void step(double lr, double grad_scale = 1.0) = 0;
  // Completed steps; the next step uses t = steps() + 1.
  virtual int64_t steps() const = 0;

  // The full state's tensors (fp32), in the order save_state writes them.
  virtual std::vector<StateTensorSpec> state_specs() const = 0;
  // Writes the full state into `into`: f32 host tensors with state_specs()' names and shapes, in
  // that order. Collective for a distributed optimizer (it gathers the shards).
  virtual void save_state(const std::vector<std::pair<std::string, Tensor>>& into) const = 0;
  // Restores the state from full tensors found by state_specs() names (converting dtype if needed)
  // and sets the step count. Throws naming the key when one is missing or has the wrong shape,
  // before changing anything; other keys are ignored, so a whole checkpoint's map can be passed.
  virtual void load_state(const std::map<std::string, Tensor>& tensors, int64_t step) = 0;
  // Blocks until the weights the last step() wrote are in place on this rank: a distributed
  // optimizer under overlap_param_gather leaves its all-gather of the updated weights in flight
  // for the next forward to wait on. Whatever reads or writes the weights outside the training
  // forward (snapshots, checkpoints, validation, the export) calls this first.
  virtual void wait_for_weights() const {}
};

}  // namespace megaton::optim
