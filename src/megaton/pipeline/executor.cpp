#include "megaton/pipeline/executor.h"

#include <algorithm>

#include "megaton/core/error.h"

namespace megaton::pipeline {

void StageRunner::communicate(const Op& op) {
  fail("schedule op ", op_name(op), " sends or receives between pipeline stages, but this stage runs in a single "
       "process with no neighbours");
}

namespace {
bool takes_input(OpKind k) {
  return k == OpKind::Forward || k == OpKind::BackwardInput || k == OpKind::ForwardBackward;
}
}  // namespace

void execute(const std::vector<Op>& ops, StageRunner& runner, OpTimes* times) {
  size_t announced = 0;  // the ops before this index were announced
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - times->origin).count();
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const size_t at = i;
    if (!compute_parts(op).empty()) {
      // The first op after this one that takes an input, unless it was announced already.
      size_t next = i + 1;
      while (next < ops.size() && !takes_input(ops[next].kind)) ++next;
      if (next < ops.size() && next >= announced) {
        runner.prepare(ops[next]);
        announced = next + 1;
      }
    }
    const double start = times ? seconds() : 0.0;
    const double waited = times ? runner.input_wait_seconds() : 0.0;
    // Whether the next op is the W of this op's B (alone or in an F&B): one call, then skipped.
    const auto takes_next_w = [&](int64_t microbatch, int chunk) {
      const bool fused = i + 1 < ops.size() && ops[i + 1] == Op{OpKind::BackwardWeight, microbatch, chunk};
      i += fused ? 1 : 0;
      return fused;
    };
    switch (op.kind) {
      case OpKind::Forward:
        runner.forward(op.microbatch, op.chunk);
        break;
      case OpKind::BackwardInput:
        if (takes_next_w(op.microbatch, op.chunk)) runner.backward(op.microbatch, op.chunk);
        else runner.backward_input(op.microbatch, op.chunk);
        break;
      case OpKind::ForwardBackward: {
        const bool with_weight = takes_next_w(op.backward_microbatch, op.backward_chunk);
        runner.forward_backward(op.microbatch, op.chunk, op.backward_microbatch, op.backward_chunk, with_weight);
        break;
      }
      case OpKind::BackwardWeight:
        runner.backward_weight(op.microbatch, op.chunk);
        break;
      case OpKind::SendForward:
      case OpKind::RecvForward:
      case OpKind::SendBackward:
      case OpKind::RecvBackward:
        runner.communicate(op);
        break;
    }
    if (times) {
      const double end = seconds();
      times->ops.push_back({op, std::min(end, start + runner.input_wait_seconds() - waited), end, i != at});
    }
  }
}

}  // namespace megaton::pipeline
