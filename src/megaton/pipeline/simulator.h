// Runs a schedule's op lists with per-op costs instead of model chunks: every stage executes its
// list in order, each op as soon as the stage is free and its inputs exist (a chunk's F needs the
// previous model chunk's F of that micro-batch, its B the next model chunk's B or, on the last
// model chunk, its own F; W needs its B), with a transfer cost between stages. A B directly
// followed by its own W is one call in the executor, so its input gradient leaves the stage only
// after both. DualPipe's overlapped F&B is one op of its own cost: it waits for both inputs, and
// its outputs leave when it (and its B's own W, directly after it) ends. The same lists the
// executor runs, so the predicted step time, bubble and activation peak are the schedule's own.
// A schedule whose stages wait on each other in a cycle is a deadlock, reported by name.
#pragma once
#include <vector>

#include "megaton/pipeline/schedule.h"

namespace megaton::pipeline {

// Seconds (or any unit) of one model chunk's F, B and W for one micro-batch.
struct ChunkCosts {
  double forward = 1, backward_input = 1, backward_weight = 1;
};

// Seconds (or any unit) per op of one model chunk and one micro-batch.
struct OpCosts {
  double forward = 1, backward_input = 1, backward_weight = 1;
  double transfer = 0;          // activation or gradient transfer between two stages
  double forward_backward = 0;  // an overlapped F&B (OpKind::ForwardBackward); 0: forward + backward_input
  // Per model chunk in layer order (Schedule::model_chunks() entries; both DualPipe copies of a chunk
  // cost the same): replaces forward / backward_input / backward_weight, so the first chunk can pay
  // for the embedding and the last for the output head (the planner's costs). An F&B costs its F's
  // plus its B's chunk; forward_backward must then be 0.
  std::vector<ChunkCosts> per_chunk{};
};

struct TimedOp {
  Op op;
  double start, end;
  bool with_weight = false;  // a B (or F&B) that ran its own W in the same call (the W is not listed)
};

// What a stage's activations hold when one of its compute parts starts, in micro-batch chunks other
// than the part's own: `saved` hold their forward's saved activations (F started, B not ended),
// `held_for_w` only what their deferred W reads (B ended, W not ended). `with_weight`: a B that runs
// its own W in the same call. An F&B is its F part, then its B part.
struct LiveActivations {
  OpKind kind;
  bool with_weight = false;
  int saved = 0, held_for_w = 0;
};

struct Simulation {
  double step_time = 0;                      // last op's end
  double bubble_fraction = 0;                // idle share of stages x step_time
  std::vector<std::vector<TimedOp>> timeline;  // per stage, compute ops in execution order
  // Per stage: the most micro-batch chunks whose forward has started and whose W has not ended
  // (W still reads the saved inputs), i.e. peak activation memory in units of one micro-batch's
  // activations of one chunk.
  std::vector<int> peak_activations;
  std::vector<std::vector<LiveActivations>> live;  // per stage, one entry per compute part in order
  std::vector<int> param_copies;  // per stage: parameters held in units of 1/p of the model (DualPipe: 2)
};

// Throws megaton::Error naming every stage's blocked op on a deadlock (or the schedule's first
// F / B / W order fault, through validate).
Simulation simulate(const Schedule& schedule, const OpCosts& costs);

}  // namespace megaton::pipeline
