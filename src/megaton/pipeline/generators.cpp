#include "megaton/pipeline/generators.h"

#include <algorithm>
#include <deque>
#include <string>

#include "megaton/core/checked.h"
#include "megaton/core/error.h"

namespace megaton::pipeline {

namespace {

void check_sizes(int stages, int chunks, int64_t microbatches) {
  MEGATON_CHECK(stages > 0 && chunks > 0 && microbatches > 0, "a schedule needs at least one stage, chunk and "
                "micro-batch; got ", stages, " stages, ", chunks, " chunks and ", microbatches, " micro-batches");
  // The lists hold 3 compute ops per (stage, chunk, micro-batch), and the V schedules count to 2p.
  checked_mul("pipeline schedule ops", checked_mul("pipeline schedule ops", 6 * int64_t{stages}, chunks), microbatches);
}

// 1F1B-shaped list of one stage: `warmup` forwards, then a forward and a backward at a time, then
// the remaining backwards. forward(k) / backward(k) name the k-th of each; the W of backward k
// follows backward k + lag (lag 0: right after its B), the rest at the end in order.
template <typename ForwardAt, typename BackwardAt>
std::vector<Op> one_f_one_b_stage(int64_t total, int64_t warmup, int64_t lag, ForwardAt forward, BackwardAt backward) {
  std::vector<Op> ops;
  warmup = std::min(warmup, total);
  for (int64_t k = 0; k < warmup; ++k) ops.push_back(forward(k));
  int64_t next_w = 0;
  for (int64_t k = 0; k < total; ++k) {
    if (k + warmup < total) ops.push_back(forward(k + warmup));
    Op b = backward(k);
    ops.push_back(b);
    if (k - lag >= 0) {
      Op w = backward(k - lag);
      w.kind = OpKind::BackwardWeight;
      ops.push_back(w);
      next_w = k - lag + 1;
    }
  }
  for (int64_t k = next_w; k < total; ++k) {
    Op w = backward(k);
    w.kind = OpKind::BackwardWeight;
    ops.push_back(w);
  }
  return ops;
}

Op forward_op(int64_t m, int chunk = 0) { return {OpKind::Forward, m, chunk}; }
Op backward_op(int64_t m, int chunk = 0) { return {OpKind::BackwardInput, m, chunk}; }

// Whether the B of chunk `chunk` on `stage` sends its input gradient to another stage: it has a
// model chunk before it and another stage holds that one.
bool gradient_leaves(const Schedule& s, int stage, int chunk) {
  const int mc = s.model_chunk_of(stage, chunk), copy = s.copy_of(stage, chunk);
  if (mc == 0) return false;
  for (int c = 0; c < s.chunks_per_stage; ++c)
    if (s.model_chunk_of(stage, c) == mc - 1 && s.copy_of(stage, c) == copy) return false;
  return true;
}

// Appends a deferred W. Run right after its own B, it would make one call with it and hold the
// gradient back until the W ends; the schedule sent the gradient first, so a SendBackward between
// them says so (no send when the gradient stays on the stage).
void push_weight(std::vector<Op>& ops, const Schedule& s, int stage, const Op& w) {
  if (!ops.empty() && ops.back() == backward_op(w.microbatch, w.chunk) && gradient_leaves(s, stage, w.chunk))
    ops.push_back({OpKind::SendBackward, w.microbatch, w.chunk});
  ops.push_back(w);
}

// 1F1B or ZB-H1: the same forwards and input gradients, W lagging by `lag(r)` on stage r.
template <typename Lag>
Schedule single_chunk(const char* name, int stages, int64_t microbatches, Lag lag) {
  check_sizes(stages, 1, microbatches);
  Schedule s{name, stages, 1, microbatches, {}, {}};
  for (int r = 0; r < stages; ++r)
    s.ops.push_back(one_f_one_b_stage(microbatches, stages - 1 - r, lag(r), [](int64_t k) { return forward_op(k); },
                                      [](int64_t k) { return backward_op(k); }));
  validate(s);
  return s;
}

}  // namespace

Schedule no_pipelining(int64_t microbatches, bool defer_weight_grads, int chunks) {
  MEGATON_CHECK(microbatches > 0, "a schedule needs at least one micro-batch, got ", microbatches);
  MEGATON_CHECK(chunks > 0, "a schedule needs at least one model chunk, got ", chunks);
  Schedule s{defer_weight_grads ? "no_pipelining_deferred_w" : "no_pipelining", 1, chunks, microbatches, {{}}, {}};
  auto& ops = s.ops[0];
  for (int64_t m = 0; m < microbatches; ++m) {
    for (int c = 0; c < chunks; ++c) ops.push_back({OpKind::Forward, m, c});
    for (int c = chunks; c-- > 0;) {
      ops.push_back({OpKind::BackwardInput, m, c});
      if (!defer_weight_grads) ops.push_back({OpKind::BackwardWeight, m, c});
    }
  }
  if (defer_weight_grads)
    for (int64_t m = 0; m < microbatches; ++m)
      for (int c = chunks; c-- > 0;) ops.push_back({OpKind::BackwardWeight, m, c});
  return s;
}

Schedule one_f_one_b(int stages, int64_t microbatches) {
  return single_chunk("1f1b", stages, microbatches, [](int) { return 0; });
}

Schedule zb_h1(int stages, int64_t microbatches) {
  return single_chunk("zb-h1", stages, microbatches, [](int r) { return r; });
}

Schedule interleaved_1f1b(int stages, int chunks, int64_t microbatches) {
  check_sizes(stages, chunks, microbatches);
  MEGATON_CHECK(microbatches % stages == 0, "interleaved 1F1B needs the micro-batches (", microbatches,
                ") to be a multiple of the pipeline stages (", stages, ")");
  Schedule s{"interleaved", stages, chunks, microbatches, {}, {}};
  const int64_t p = stages, v = chunks, total = microbatches * v;
  // The k-th forward of a stage: micro-batch groups of p, each through every chunk in turn.
  const auto forward = [p, v](int64_t k) {
    return forward_op((k / (p * v)) * p + k % p, static_cast<int>((k % (p * v)) / p));
  };
  const auto backward = [&](int64_t k) {
    Op op = forward(k);
    return backward_op(op.microbatch, chunks - 1 - op.chunk);
  };
  for (int64_t r = 0; r < p; ++r)
    s.ops.push_back(one_f_one_b_stage(total, (p - r - 1) * 2 + (v - 1) * p, 0, forward, backward));
  validate(s);
  return s;
}

Schedule zb_h2(int stages, int64_t microbatches) {
  check_sizes(stages, 1, microbatches);
  Schedule s{"zb-h2", stages, 1, microbatches, std::vector<std::vector<Op>>(static_cast<size_t>(stages)), {}};
  // List scheduling in unit time steps (F = B = W = 1). end_f[r][i] / end_b[r][i]: the step at which
  // stage r's F / B of micro-batch i has ended (-1: not yet run).
  const int64_t limit = 2 * int64_t{stages} - 1, m = microbatches;
  std::vector<std::vector<int64_t>> end_f(static_cast<size_t>(stages), std::vector<int64_t>(static_cast<size_t>(m), -1));
  auto end_b = end_f;
  std::vector<int64_t> next_f(static_cast<size_t>(stages), 0), next_b = next_f, next_w = next_f, in_flight = next_f;
  size_t left = static_cast<size_t>(3 * m * stages);
  for (int64_t t = 0; left > 0; ++t) {
    MEGATON_CHECK(t < 3 * m * stages + 4 * int64_t{stages}, "zb-h2: list scheduling did not finish");  // cannot happen
    for (int r = 0; r < stages; ++r) {
      const auto R = static_cast<size_t>(r);
      const auto done_by = [t](int64_t end) { return end >= 0 && end <= t; };
      auto& ops = s.ops[R];
      const int64_t b = next_b[R], f = next_f[R];
      if (b < m && (r == stages - 1 ? done_by(end_f[R][static_cast<size_t>(b)])
                                    : done_by(end_b[R + 1][static_cast<size_t>(b)]))) {
        ops.push_back(backward_op(b));
        end_b[R][static_cast<size_t>(b)] = t + 1, ++next_b[R];
      } else if (f < m && in_flight[R] < limit && (r == 0 || done_by(end_f[R - 1][static_cast<size_t>(f)]))) {
        ops.push_back(forward_op(f));
        end_f[R][static_cast<size_t>(f)] = t + 1, ++next_f[R], ++in_flight[R];
      } else if (next_w[R] < next_b[R]) {
        ops.push_back({OpKind::BackwardWeight, next_w[R]++, 0});
        --in_flight[R];
      } else {
        continue;  // idle this step
      }
      --left;
    }
  }
  validate(s);
  return s;
}

Schedule zbv(int stages, int64_t microbatches) {
  check_sizes(stages, 2, microbatches);
  Schedule s{"zbv", stages, 2, microbatches};
  const int p = stages;
  // Fewer than 2p-1 micro-batches cannot fill the warm-up: build the order for 2p-1 and drop the
  // ops of the micro-batches that do not exist (every stage drops the same ones, so what is left
  // keeps its dependencies and order; the missing ones leave bubbles).
  const int64_t n = std::max<int64_t>(microbatches, 2 * int64_t{p} - 1);
  for (int r = 0; r < p; ++r) s.model_chunk.push_back({r, 2 * p - 1 - r});
  for (int r = 0; r < p; ++r) {
    std::vector<Op> ops;
    int64_t next_f[2] = {0, 0}, next_b[2] = {0, 0};
    std::deque<Op> weights;  // deferred Ws, run oldest first
    const auto F = [&](int c) { ops.push_back(forward_op(next_f[c]++, c)); };
    const auto B = [&](int c) {
      ops.push_back(backward_op(next_b[c], c));
      weights.push_back({OpKind::BackwardWeight, next_b[c]++, c});
    };
    const auto W = [&] {
      push_weight(ops, s, r, weights.front());
      weights.pop_front();
    };
    for (int64_t i = 0; i < 2 * int64_t{p - r} - 1; ++i) F(0);  // 1: chunk-0 forwards down the V
    for (int i = 0; i < r; ++i) F(1), F(0);           // 2: the first chunk-1 forwards come back up
    for (int i = 0; i < p - r; ++i) F(1), B(1), W();  // 3: the first input gradients start down
    while (next_f[1] < next_f[0] || next_f[0] < n) {  // 4: steady, F B W of each chunk in turn
      if (next_f[0] < n) F(0);
      B(0), W(), F(1), B(1), W();
    }
    for (int i = 0; i < r; ++i) B(0), B(1);  // 5: input gradients only, their Ws deferred
    for (int i = 0; i < p - r; ++i) B(0), W();  // 6: the last chunk-0 gradients, a W each
    while (!weights.empty()) W();               // 7: the Ws left
    std::erase_if(ops, [&](const Op& op) { return op.microbatch >= microbatches; });
    s.ops.push_back(std::move(ops));
  }
  validate(s);
  return s;
}

namespace {

// One stage of the DualPipe family: dualpipe.py and dualpipev.py run the same eight phases on two
// "phases" of work, each a model chunk of the stage with its own run of micro-batches. `half`:
// stages in one half of the pipeline (DualPipeV: all p, DualPipe: p/2); `h`: the stage's place in
// its half; phase f runs on chunk[f], micro-batches first[f] .. first[f] + per_phase - 1.
struct DualPipeStage {
  int half, h;
  int64_t per_phase;
  int chunk[2];
  int64_t first[2];
};

std::vector<Op> dualpipe_stage(const Schedule& s, int stage, const DualPipeStage& d) {
  std::vector<Op> ops;
  int64_t next_f[2] = {0, 0}, next_b[2] = {0, 0};
  std::deque<Op> weights;  // deferred Ws, run oldest first
  const auto fwd = [&](int f) { return forward_op(d.first[f] + next_f[f]++, d.chunk[f]); };
  const auto bwd = [&](int f) { return backward_op(d.first[f] + next_b[f]++, d.chunk[f]); };
  const auto weight_of = [](const Op& b) { return Op{OpKind::BackwardWeight, b.microbatch, b.chunk}; };
  const auto F = [&](int f) { ops.push_back(fwd(f)); };
  // B of phase f; its W right after (one call: the full backward) or, with `defer`, queued.
  const auto B = [&](int f, bool defer) {
    const Op b = bwd(f);
    ops.push_back(b);
    if (defer) weights.push_back(weight_of(b));
    else ops.push_back(weight_of(b));
  };
  // The overlapped F of phase f and B of phase g, with the B's whole backward (W included).
  const auto FB = [&](int f, int g) {
    const Op forward = fwd(f), backward = bwd(g);
    ops.push_back({OpKind::ForwardBackward, forward.microbatch, forward.chunk, backward.microbatch, backward.chunk});
    ops.push_back(weight_of(backward));
  };
  const auto W = [&] {
    push_weight(ops, s, stage, weights.front());
    weights.pop_front();
  };
  const int rest = d.half - d.h - 1;
  for (int64_t i = 0; i < 2 * int64_t{rest}; ++i) F(0);  // 1: phase-0 forwards
  for (int i = 0; i < d.h + 1; ++i) F(0), F(1);       // 2: both phases
  for (int i = 0; i < rest; ++i) B(1, true), W(), F(1);  // 3: B W F on phase 1 (W deferred, run at once)
  for (int64_t i = 0; i < d.per_phase - 2 * int64_t{d.half} + d.h + 1; ++i) {  // 4: main, F0&B1 then F1&B0
    // The last stage of the half runs its first pair apart, as dualpipe.py does "to further reduce
    // bubble size": the F need not wait for the B's gradient. (There the F's output is sent after the
    // B; here it leaves when the F ends.)
    if (i == 0 && d.h == d.half - 1) F(0), B(1, false);
    else FB(0, 1);
    FB(1, 0);
  }
  for (int i = 0; i < rest; ++i) B(1, false), FB(1, 0);  // 5: no more phase-0 forwards
  bool defer = false;  // 6: the backwards left; the second half defers W
  for (int i = 0; i < d.h + 1; ++i) {
    if (i == (d.h + 1) / 2 && d.h % 2 == 1) defer = true;
    B(1, defer);
    if (i == (d.h + 1) / 2 && d.h % 2 == 0) defer = true;
    B(0, defer);
  }
  for (int i = 0; i < rest; ++i) W(), B(0, true);  // 7: a W, then a phase-0 B
  while (!weights.empty()) W();                    // 8: the Ws left
  return ops;
}

}  // namespace

Schedule dualpipev(int stages, int64_t microbatches) {
  check_sizes(stages, 2, microbatches);
  MEGATON_CHECK(microbatches >= 2 * int64_t{stages}, "dualpipev needs at least twice as many micro-batches (",
                microbatches, ") as pipeline stages (", stages, ")");
  Schedule s{"dualpipev", stages, 2, microbatches};
  for (int r = 0; r < stages; ++r) s.model_chunk.push_back({r, 2 * stages - 1 - r});
  for (int r = 0; r < stages; ++r) s.ops.push_back(dualpipe_stage(s, r, {stages, r, microbatches, {0, 1}, {0, 0}}));
  validate(s);
  return s;
}

Schedule dualpipe(int stages, int64_t microbatches) {
  check_sizes(stages, 2, microbatches);
  MEGATON_CHECK(stages % 2 == 0, "dualpipe needs an even number of pipeline stages, not ", stages);
  MEGATON_CHECK(microbatches % 2 == 0 && microbatches >= 2 * int64_t{stages}, "dualpipe needs an even number of "
                "micro-batches, at least twice the pipeline stages (", stages, "); got ", microbatches);
  Schedule s{"dualpipe", stages, 2, microbatches};
  s.copies = 2;
  const int half = stages / 2;
  const int64_t per_direction = microbatches / 2;
  for (int r = 0; r < stages; ++r) {
    s.model_chunk.push_back({r, stages - 1 - r});  // chunk c is copy c: stage r of one direction, p-1-r of the other
    s.chunk_copy.push_back({0, 1});
  }
  for (int r = 0; r < stages; ++r) {
    // Each half of the pipeline starts its own direction: phase 0 is the direction that enters on its side.
    const int second_half = r >= half ? 1 : 0;
    const int phase0 = second_half, phase1 = 1 - second_half;
    s.ops.push_back(dualpipe_stage(s, r, {half, std::min(r, stages - 1 - r), per_direction, {phase0, phase1},
                                          {phase0 * per_direction, phase1 * per_direction}}));
  }
  validate(s);
  return s;
}

std::vector<std::string> schedule_kinds() {
  return {"none", "1f1b", "interleaved", "zb-h1", "zb-h2", "zbv", "dualpipe", "dualpipev"};
}

Schedule generate(const std::string& kind, int stages, int chunks, int64_t microbatches) {
  if (kind == "interleaved") return interleaved_1f1b(stages, chunks, microbatches);
  if (kind == "none") {
    if (stages != 1) fail("schedule 'none' runs on one pipeline stage, not ", stages);
    return no_pipelining(microbatches, false, chunks);
  }
  if (kind == "1f1b" || kind == "zb-h1" || kind == "zb-h2") {
    if (chunks != 1) fail("schedule '", kind, "' has one model chunk per stage, not ", chunks, " (interleaved takes more)");
    return kind == "1f1b" ? one_f_one_b(stages, microbatches)
           : kind == "zb-h1" ? zb_h1(stages, microbatches) : zb_h2(stages, microbatches);
  }
  if (kind == "zbv" || kind == "dualpipe" || kind == "dualpipev") {
    if (chunks != 2)
      fail("schedule '", kind, "' has two model chunks per stage (", kind == "dualpipe" ? "one per direction" : "a V",
           "), not ", chunks, "; pass --vpp 2");
    return kind == "zbv" ? zbv(stages, microbatches) : kind == "dualpipe" ? dualpipe(stages, microbatches)
                                                                          : dualpipev(stages, microbatches);
  }
  std::string known;
  for (const auto& k : schedule_kinds()) known += (known.empty() ? "" : ", ") + k;
  fail("unknown pipeline schedule '", kind, "' (known: ", known, ")");
}

}  // namespace megaton::pipeline
