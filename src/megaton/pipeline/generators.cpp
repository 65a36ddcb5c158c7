#include "megaton/pipeline/generators.h"

#include <algorithm>
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

std::vector<std::string> schedule_kinds() { return {"none", "1f1b", "interleaved", "zb-h1"}; }

Schedule generate(const std::string& kind, int stages, int chunks, int64_t microbatches) {
  if (kind == "interleaved") return interleaved_1f1b(stages, chunks, microbatches);
  if (kind == "none") {
    if (stages != 1) fail("schedule 'none' runs on one pipeline stage, not ", stages);
    return no_pipelining(microbatches, false, chunks);
  }
  if (kind == "1f1b" || kind == "zb-h1") {
    if (chunks != 1) fail("schedule '", kind, "' has one model chunk per stage, not ", chunks, " (interleaved takes more)");
    return kind == "1f1b" ? one_f_one_b(stages, microbatches) : zb_h1(stages, microbatches);
  }
  std::string known;
  for (const auto& k : schedule_kinds()) known += (known.empty() ? "" : ", ") + k;
  fail("unknown pipeline schedule '", kind, "' (known: ", known, ")");
}

}  // namespace megaton::pipeline
