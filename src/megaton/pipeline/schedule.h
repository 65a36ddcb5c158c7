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
};

struct Op {
  OpKind kind;
  int64_t microbatch;
  int chunk = 0;  // model chunk on this stage (virtual pipeline stage), 0 without interleaving

  bool operator==(const Op&) const = default;
};

struct Schedule {
  std::string name;
  int stages = 1;
  int chunks_per_stage = 1;
  int64_t microbatches = 0;
  std::vector<std::vector<Op>> ops;  // per stage, in execution order
  // Which model chunk, in layer order (0 .. stages * chunks_per_stage - 1), chunk c of stage r
  // holds: model_chunk[r][c]. Empty means Megatron's interleaving, c * stages + r; a V-shaped
  // schedule (ZB-V) places chunk 1 of stage r at 2 * stages - 1 - r.
  std::vector<std::vector<int>> model_chunk;

  int model_chunk_of(int stage, int chunk) const {
    return model_chunk.empty() ? chunk * stages + stage
                               : model_chunk[static_cast<size_t>(stage)][static_cast<size_t>(chunk)];
  }
};

// Throws megaton::Error naming the stage, op and micro-batch unless every (micro-batch, chunk) of
// every stage runs F, then B, then W, each exactly once, and every op is in range.
void validate(const Schedule& schedule);

std::string op_name(const Op& op);  // "F3", "B0.1" (micro-batch 0, chunk 1), "sendF2", ...
// One line per stage: "stage 0: F0 B0 W0 F1 ...".
std::string describe(const Schedule& schedule);

}  // namespace megaton::pipeline
