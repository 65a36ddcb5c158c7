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

// ZB-H2 (Zero Bubble, Qi et al. 2023, section 2.2): up to 2p-1 micro-batches in flight per stage so
// that warm-up forwards fill the wait for the first B, W fills every later gap and the Ws of the
// warm-up move to the tail: a parallelogram. Built by list scheduling in unit steps (F = B = W):
// each step a stage runs its next B if its input is there, else its next F if the input is there
// and fewer than 2p-1 micro-batches are in flight, else its oldest deferred W, else idles. With
// m >= 2p-1 the step is m(F+B+W) + (p-1)F, the least any schedule can take (the last stage cannot
// start sooner), and each stage is idle (p-1)(F+B-2W), floored at 0, between its first op and its
// last: the paper's zero bubble at F = B = W (its optimizer post-validation lets the next step
// start as a stage finishes, so the (p-1)F start offsets overlap).
Schedule zb_h2(int stages, int64_t microbatches);

// ZB-V (Zero Bubble, Qi et al. 2023, arXiv 2401.10241 section 6): two chunks per stage in a V
// (stage r holds model chunks r and 2p-1-r, set in model_chunk), so a micro-batch's forward goes
// down the stages and back up, and its backward the same way. Per stage r: 2(p-r)-1 chunk-0
// forwards; r pairs F1 F0; p-r of F1 B1 W; then F0 B0 W F1 B1 W while forwards are left; r pairs B0
// B1 (Ws deferred); p-r of B0 W; the Ws left. Every W is the oldest deferred one; a W run right
// after its own B follows a SendBackward (the gradient leaves first). At F = B = W each stage is
// busy from its first op to its last (the step is m(2F+2B+2W) + (p-1)F, the (p-1)F being the
// last stage's wait for its first input, which post-validation overlaps with the previous step),
// with 2p chunk activations in flight: 1F1B's peak of p whole stages. Any m >= 1 (fewer than 2p-1
// leave the warm-up unfilled).
Schedule zbv(int stages, int64_t microbatches);

// DualPipe (DeepSeek-V3, github.com/deepseek-ai/DualPipe dualpipe.py): p even, two copies of the
// model (copies = 2). Stage r holds stage r of the forward direction (chunk 0, copy 0: micro-batches
// [0, m/2), entering at stage 0) and stage p-1-r of the reverse one (chunk 1, copy 1: [m/2, m),
// entering at stage p-1). Each half of the pipeline runs dualpipe.py's eight phases with its own
// direction as the first phase; the F of one direction and the B of the other run as one
// overlapped ForwardBackward op (with that B's W: a full backward). Needs m even and >= 2p. Peak
// activations p+1 chunk units (chunks of 1/p of the model), parameters twice 1F1B's.
Schedule dualpipe(int stages, int64_t microbatches);

// DualPipeV (DeepSeek's DualPipe "cut in half", dualpipev.py): two chunks per stage in a V (stage r
// holds model chunks r and 2p-1-r) and one copy; per stage r DualPipe's eight phases with the whole
// pipeline as one half: 2(p-r-1) chunk-0 forwards; r+1 pairs F0 F1; p-r-1 of B1 W F1 (W deferred
// but run at once, after the gradient is sent: a SendBackward marks it); m-2p+r+1 of F0&B1 F1&B0
// (overlapped pairs, the last stage's first one run apart); p-r-1 of B1 F1&B0; r+1 of B1 B0 (the
// second half deferring W); p-r-1 of W B0; the Ws left. Needs m >= 2p. Peak activations 2p+1 chunk
// units (the README's PP+1 with PP = 2p pipeline stages).
Schedule dualpipev(int stages, int64_t microbatches);

// The schedule named `kind` ("none", "1f1b", "interleaved", "zb-h1", "zb-h2", "zbv", "dualpipe", "dualpipev";
// Megatron-style names for `[parallel] pipeline_schedule` and `megaton schedule --kind`). Throws
// naming an unknown kind or sizes the kind does not take ("none" runs on one stage; "interleaved"
// takes chunks >= 1, "zbv", "dualpipe" and "dualpipev" exactly 2, the others 1).
Schedule generate(const std::string& kind, int stages, int chunks, int64_t microbatches);
std::vector<std::string> schedule_kinds();

}  // namespace megaton::pipeline
