#include "megaton/pipeline/executor.h"

#include "megaton/core/error.h"

namespace megaton::pipeline {

void StageRunner::communicate(const Op& op) {
  fail("schedule op ", op_name(op), " sends or receives between pipeline stages, but this stage runs in a single "
       "process with no neighbours");
}

void execute(const std::vector<Op>& ops, StageRunner& runner) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    switch (op.kind) {
      case OpKind::Forward:
        runner.forward(op.microbatch, op.chunk);
        break;
      case OpKind::BackwardInput:
        if (i + 1 < ops.size() && ops[i + 1] == Op{OpKind::BackwardWeight, op.microbatch, op.chunk}) {
          runner.backward(op.microbatch, op.chunk);
          ++i;
        } else {
          runner.backward_input(op.microbatch, op.chunk);
        }
        break;
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
  }
}

}  // namespace megaton::pipeline
