#include "megaton/pipeline/generators.h"

#include <algorithm>
#include <deque>
#include <string>

#include "megaton/core/error.h"

namespace megaton::pipeline {

namespace {

void check_sizes(int stages, int chunks, int64_t microbatches) {
  MEGATON_CHECK(stages > 0 && chunks > 0 && microbatches > 0, "a schedule needs at least one stage, chunk and "
                "micro-batch; got ", stages, " stages, ", chunks, " chunks and ", microbatches, " micro-batches");
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

Schedule dualpipev(int stages, int64_t microbatches) {
  check_sizes(stages, 2, microbatches);
  MEGATON_CHECK(microbatches >= 2 * int64_t{stages}, "dualpipev needs at least twice as many micro-batches (",
                microbatches, ") as pipeline stages (", stages, ")");
  Schedule s{"dualpipev", stages, 2, microbatches, {}, {}};
  const int p = stages;
  for (int r = 0; r < p; ++r) {
    s.model_chunk.push_back({r, 2 * p - 1 - r});
    std::vector<Op> ops;
    int64_t next_f[2] = {0, 0}, next_b[2] = {0, 0};
    std::deque<Op> weights;  // deferred Ws, run oldest first
    const auto F = [&](int c) { ops.push_back(forward_op(next_f[c]++, c)); };
    // B of chunk c; its W right after (one call) or, with `defer`, queued for a later pop_w.
    const auto B = [&](int c, bool defer) {
      const Op b = backward_op(next_b[c]++, c);
      ops.push_back(b);
      const Op w{OpKind::BackwardWeight, b.microbatch, c};
      if (defer) weights.push_back(w);
      else ops.push_back(w);
    };
    const auto pop_w = [&] {
      const Op w = weights.front();
      weights.pop_front();
      // A deferred W popped right after its own B: the gradient has already been sent (DualPipeV
      // sends before it runs W), so say so, or the B and W would be one call. No send from model
      // chunk 0, nor from stage p-1's chunk 1 (its gradient stays on the stage).
      const bool sends = s.model_chunk_of(r, w.chunk) != 0 && !(r == p - 1 && w.chunk == 1);
      if (sends && ops.back() == Op{OpKind::BackwardInput, w.microbatch, w.chunk})
        ops.push_back({OpKind::SendBackward, w.microbatch, w.chunk});
      ops.push_back(w);
    };
    for (int i = 0; i < 2 * (p - r - 1); ++i) F(0);          // 1: chunk-0 forwards
    for (int i = 0; i < r + 1; ++i) F(0), F(1);               // 2: both chunks
    for (int i = 0; i < p - r - 1; ++i) B(1, true), pop_w(), F(1);  // 3: B W F on chunk 1
    for (int64_t i = 0; i < microbatches - 2 * p + r + 1; ++i)      // 4: main, F0 B1 F1 B0
      F(0), B(1, false), F(1), B(0, false);
    for (int i = 0; i < p - r - 1; ++i) B(1, false), F(1), B(0, false);  // 5: no more chunk-0 forwards
    bool defer = false;  // 6: the backwards left; the second half defers W
    for (int i = 0; i < r + 1; ++i) {
      if (i == (r + 1) / 2 && r % 2 == 1) defer = true;
      B(1, defer);
      if (i == (r + 1) / 2 && r % 2 == 0) defer = true;
      B(0, defer);
    }
    for (int i = 0; i < p - r - 1; ++i) pop_w(), B(0, true);  // 7: a W, then a chunk-0 B
    while (!weights.empty()) pop_w();                          // 8: the Ws left
    s.ops.push_back(std::move(ops));
  }
  validate(s);
  return s;
}

std::vector<std::string> schedule_kinds() { return {"none", "1f1b", "interleaved", "zb-h1", "zb-h2", "dualpipev"}; }

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
  if (kind == "dualpipev") {
    if (chunks != 2) fail("schedule 'dualpipev' has two model chunks per stage (a V), not ", chunks, "; pass --vpp 2");
    return dualpipev(stages, microbatches);
  }
  std::string known;
  for (const auto& k : schedule_kinds()) known += (known.empty() ? "" : ", ") + k;
  fail("unknown pipeline schedule '", kind, "' (known: ", known, ")");
}

}  // namespace megaton::pipeline
