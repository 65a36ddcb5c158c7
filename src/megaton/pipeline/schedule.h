// Schedules as data: a schedule is, for every pipeline stage (rank), the ordered list of
// operations it runs in one training step: forward (F), backward-input (B), backward-weight (W)
// of a micro-batch on one of the stage's model chunks, and the point-to-point sends / receives
// of activations and their gradients between neighbouring stages. The executor runs these lists
// on real model chunks; the planner runs the same lists with modelled costs. One generator, two
// users: a schedule is never re-implemented as control flow.
//
// The generators are in generators.h; the simulator (simulator.h) runs the same lists with costs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace megaton::pipeline {

enum class OpKind : uint8_t {
  Forward,         // F
  BackwardInput,   // B: gradient w.r.t. the chunk's input
  BackwardWeight,  // W: gradients w.r.t. the chunk's weights (may run later than its B)
  SendForward,     // activations to the next stage
  RecvForward,     // activations from the previous stage
  SendBackward,    // input gradients to the previous stage
  RecvBackward,    // output gradients from the next stage
  // DualPipe's F&B: the F of (microbatch, chunk) and the B of (backward_microbatch, backward_chunk),
  // micro-batches of the two directions, run as one overlapped call: it starts once both inputs are
  // there and both outputs leave when it ends (followed by its B's own W, after that W too).
  ForwardBackward,
};

struct Op {
  OpKind kind;
  int64_t microbatch;
  int chunk = 0;  // model chunk on this stage (virtual pipeline stage), 0 without interleaving
  int64_t backward_microbatch = 0;  // ForwardBackward only: its B's micro-batch and chunk
  int backward_chunk = 0;

  bool operator==(const Op&) const = default;
};

// The F, B and W ops a compute op stands for: itself, or a ForwardBackward's F and B. Empty for
// communication ops.
struct OpParts {  // at most two (an F&B's); a fixed array: the planner's simulations call this a lot
  Op ops[2];
  int count = 0;
  const Op* begin() const { return ops; }
  const Op* end() const { return ops + count; }
  bool empty() const { return count == 0; }
  const Op& back() const { return ops[count - 1]; }
};
OpParts compute_parts(const Op& op);

struct Schedule {
  std::string name;
  int stages = 1;
  int chunks_per_stage = 1;
  int64_t microbatches = 0;
  std::vector<std::vector<Op>> ops{};  // per stage, in execution order
  // Which model chunk, in layer order (0 .. stages * chunks_per_stage - 1), chunk c of stage r
  // holds: model_chunk[r][c]. Empty means Megatron's interleaving, c * stages + r; a V-shaped
  // schedule (ZB-V) places chunk 1 of stage r at 2 * stages - 1 - r.
  std::vector<std::vector<int>> model_chunk{};
  // Parameter copies of the model. DualPipe keeps 2: copy 0 runs micro-batches [0, m/2) from stage 0
  // down, copy 1 runs [m/2, m) from stage p-1 up, each micro-batch through its own copy's chunks
  // only. chunk_copy[r][c]: the copy chunk c of stage r belongs to (empty with one copy).
  int copies = 1;
  std::vector<std::vector<int>> chunk_copy{};

  int model_chunk_of(int stage, int chunk) const {
    return model_chunk.empty() ? chunk * stages + stage
                               : model_chunk[static_cast<size_t>(stage)][static_cast<size_t>(chunk)];
  }
  int copy_of(int stage, int chunk) const {
    return chunk_copy.empty() ? 0 : chunk_copy[static_cast<size_t>(stage)][static_cast<size_t>(chunk)];
  }
  int copy_of_microbatch(int64_t microbatch) const {  // validate checks microbatches % copies == 0
    return static_cast<int>(microbatch / (microbatches / copies));
  }
  // Model chunks of one copy, in layer order: the length of a micro-batch's path.
  int model_chunks() const { return stages * chunks_per_stage / copies; }
  // Whether micro-batch `microbatch` passes through chunk `chunk` of stage `stage`.
  bool runs(int stage, int chunk, int64_t microbatch) const {
    return copy_of(stage, chunk) == copy_of_microbatch(microbatch);
  }
};

// Throws megaton::Error naming the stage, op and micro-batch unless every (micro-batch, chunk) of
// every stage that the micro-batch passes runs F, then B, then W, each exactly once (no other pair
// runs any), every op is in range, and the chunk placement holds every model chunk of every copy
// exactly once.
void validate(const Schedule& schedule);

// "F3", "B0.1" (micro-batch 0, chunk 1), "sendF2", "F4&B1.1" (an overlapped F4 and B1.1), ...
std::string op_name(const Op& op);
// One line per stage: "stage 0: F0 B0 W0 F1 ...".
std::string describe(const Schedule& schedule);

}  // namespace megaton::pipeline
