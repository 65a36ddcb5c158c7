// Schedule generators: for a number of pipeline stages, model chunks per stage and micro-batches,
// the op list of every stage (see schedule.h). Adding a schedule means adding a generator here;
// the executor, the trainer and the simulator run any list.
//
// A B directly followed by its own W is one backward call in the executor, and its input gradient
// leaves the stage after both (the simulator models it so); a W placed later is deferred, which
// is what lets Zero Bubble schedules send gradients earlier and fill bubbles with W.
#pragma once
#include "megaton/pipeline/schedule.h"

namespace megaton::pipeline {

// One stage. Per micro-batch the forward of every chunk in order, then the backward of every chunk
// in reverse. defer_weight_grads = false: each chunk's W right after its B (gradient accumulation
// as every trainer does it); true: every W at the end of the step (what a Zero Bubble schedule
// does on its last stage, here so the deferred path is exercised in one process).
Schedule no_pipelining(int64_t microbatches, bool defer_weight_grads = false, int chunks = 1);

// 1F1B (PipeDream-Flush, Megatron's default): stage r runs min(p-1-r, m) warm-up forwards, then
// one forward and one backward (B with its W) at a time, then the remaining backwards. Bubble
// (p-1)(F+B+W); at most p micro-batches in flight on the first stage.
Schedule one_f_one_b(int stages, int64_t microbatches);

// Megatron's interleaved 1F1B: `chunks` model chunks per stage, chunk c of stage r being model
// chunk c*p + r; forwards go through the chunks in groups of p micro-batches, backwards through
// them in reverse. microbatches must be a multiple of stages. Bubble (p-1)(F+B+W) in per-chunk
// costs, i.e. 1/chunks of 1F1B's.
Schedule interleaved_1f1b(int stages, int chunks, int64_t microbatches);

// ZB-H1 (Zero Bubble, Qi et al. 2023): 1F1B's order of forwards and input gradients, with stage r
// running the W of micro-batch i after the B of micro-batch i + r (later stages defer more, so
// the input gradients travel back at B's pace) and the deferred Ws at the end, oldest first. Bubble
// (p-1)(F+B-W) when W <= F; the same activation peak as 1F1B.
Schedule zb_h1(int stages, int64_t microbatches);

// The schedule named `kind` ("none", "1f1b", "interleaved", "zb-h1"; Megatron-style names for
// `[parallel] pipeline_schedule` and `megaton schedule --kind`). Throws naming an unknown kind
// or sizes the kind does not take ("none" runs on one stage; only "interleaved" takes chunks > 1).
Schedule generate(const std::string& kind, int stages, int chunks, int64_t microbatches);
std::vector<std::string> schedule_kinds();

}  // namespace megaton::pipeline
