// Runs one stage's list of schedule ops on that stage's model chunks. The executor owns no model
// and no data: a StageRunner does the work of each op (the trainer's runner feeds micro-batches
// and keeps one activation context per micro-batch in flight).
#pragma once
#include <cstdint>
#include <vector>

#include "megaton/pipeline/schedule.h"

namespace megaton::pipeline {

class StageRunner {
 public:
  virtual ~StageRunner() = default;
  virtual void forward(int64_t microbatch, int chunk) = 0;
  virtual void backward_input(int64_t microbatch, int chunk) = 0;
  virtual void backward_weight(int64_t microbatch, int chunk) = 0;
  // A B directly followed by its own W: one call, so a chunk can run each layer's W right after
  // its B and free that layer's activations as backward goes down. Same result as B then W.
  virtual void backward(int64_t microbatch, int chunk) {
    backward_input(microbatch, chunk);
    backward_weight(microbatch, chunk);
  }
  // Point-to-point transfers with the neighbouring stages. A single-process runner has none, so
  // the defaults refuse with the op's name.
  virtual void communicate(const Op& op);
};

// Runs `ops` in order on `runner` (B immediately followed by the same micro-batch's W goes to
// runner.backward).
void execute(const std::vector<Op>& ops, StageRunner& runner);

}  // namespace megaton::pipeline
