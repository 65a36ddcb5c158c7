// Runs one stage's list of schedule ops on that stage's model chunks. The executor owns no model
// and no data: a StageRunner does the work of each op (the trainer's runner feeds micro-batches
// and keeps one activation context per micro-batch in flight).
#pragma once
#include <chrono>
#include <cstdint>
#include <vector>

#include "megaton/pipeline/schedule.h"
#include "megaton/pipeline/simulator.h"

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
  // DualPipe's overlapped F&B: the forward of (f_microbatch, f_chunk) and the input gradient of
  // (b_microbatch, b_chunk), with that B's W too when `with_weight` (the op is followed by it). A
  // runner that cannot interleave the two runs them one after the other, as DualPipe itself does
  // for modules without an overlapped forward-backward: the same result, without the overlap.
  virtual void forward_backward(int64_t f_microbatch, int f_chunk, int64_t b_microbatch, int b_chunk,
                                bool with_weight) {
    forward(f_microbatch, f_chunk);
    if (with_weight) backward(b_microbatch, b_chunk);
    else backward_input(b_microbatch, b_chunk);
  }
  // Called with the next op that takes an input from outside (F, B or F&B) before the op ahead of
  // it runs, once: a pipelined runner posts that op's receives here so they travel while the
  // current op computes. Nothing to do in one process.
  virtual void prepare(const Op& next) { (void)next; }
  // Point-to-point transfers with the neighbouring stages. A single-process runner has none, so
  // the defaults refuse with the op's name.
  virtual void communicate(const Op& op);
  // Seconds spent so far blocked waiting for inputs from other stages (inside F, B and F&B): the
  // op timings leave it out, so a timed op is its compute alone. 0 in one process.
  virtual double input_wait_seconds() const { return 0; }
};

// The wall-clock times of executed ops: seconds since `origin`, in execution order (a B that ran its
// W in the same call is one entry, with_weight set). An op starts once its inputs have arrived:
// the time it waited for them is left out.
struct OpTimes {
  std::chrono::steady_clock::time_point origin = std::chrono::steady_clock::now();
  std::vector<TimedOp> ops;
};

// Runs `ops` in order on `runner` (B immediately followed by the same micro-batch's W goes to
// runner.backward; an F&B followed by its B's W to forward_backward with the weight), announcing
// the next F, B or F&B to runner.prepare before each compute op. With `times`, appends each op's
// start and end to it (communication ops included).
void execute(const std::vector<Op>& ops, StageRunner& runner, OpTimes* times = nullptr);

}  // namespace megaton::pipeline
