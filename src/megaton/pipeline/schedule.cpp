#include "megaton/pipeline/schedule.h"

#include <map>
#include <utility>

#include "megaton/core/error.h"

namespace megaton::pipeline {

std::string op_name(const Op& op) {
  static constexpr const char* names[] = {"F", "B", "W", "sendF", "recvF", "sendB", "recvB"};
  std::string s = names[static_cast<size_t>(op.kind)];
  s += std::to_string(op.microbatch);
  if (op.chunk != 0) {
    s += '.';
    s += std::to_string(op.chunk);
  }
  return s;
}

std::string describe(const Schedule& schedule) {
  std::string out;
  for (size_t st = 0; st < schedule.ops.size(); ++st) {
    out += "stage ";
    out += std::to_string(st);
    out += ':';
    for (const Op& op : schedule.ops[st]) {
      out += ' ';
      out += op_name(op);
    }
    out += '\n';
  }
  return out;
}

void validate(const Schedule& s) {
  MEGATON_CHECK(s.stages >= 1 && s.chunks_per_stage >= 1 && s.microbatches >= 1, "schedule '", s.name,
                "' has ", s.stages, " stages, ", s.chunks_per_stage, " chunks per stage and ", s.microbatches,
                " micro-batches; each must be at least 1");
  MEGATON_CHECK(s.ops.size() == static_cast<size_t>(s.stages), "schedule '", s.name, "' lists ", s.ops.size(),
                " stages' ops for ", s.stages, " stages");
  for (int st = 0; st < s.stages; ++st) {
    // Per (micro-batch, chunk): how many of F, B, W have run so far, in that order.
    std::map<std::pair<int64_t, int>, int> done;
    auto where = [&](const Op& op) { return "schedule '" + s.name + "' stage " + std::to_string(st) + " op " + op_name(op); };
    for (const Op& op : s.ops[static_cast<size_t>(st)]) {
      MEGATON_CHECK(op.microbatch >= 0 && op.microbatch < s.microbatches, where(op), ": micro-batch out of range [0, ",
                    s.microbatches, ")");
      MEGATON_CHECK(op.chunk >= 0 && op.chunk < s.chunks_per_stage, where(op), ": chunk out of range [0, ",
                    s.chunks_per_stage, ")");
      const int order = op.kind == OpKind::Forward ? 0 : op.kind == OpKind::BackwardInput ? 1
                        : op.kind == OpKind::BackwardWeight ? 2 : -1;
      if (order < 0) continue;  // communication ops pair up across stages: not checked here yet
      int& n = done[{op.microbatch, op.chunk}];
      MEGATON_CHECK(n == order, where(op), ": expected ", n == 0 ? "F" : n == 1 ? "B" : n == 2 ? "W" : "nothing more",
                    " next for this micro-batch");
      ++n;
    }
    for (int64_t m = 0; m < s.microbatches; ++m)
      for (int c = 0; c < s.chunks_per_stage; ++c) {
        auto it = done.find({m, c});
        const int n = it == done.end() ? 0 : it->second;
        MEGATON_CHECK(n == 3, "schedule '", s.name, "' stage ", st, ": micro-batch ", m, " chunk ", c, " stops after ",
                      n, " of its F, B, W");
      }
  }
}

}  // namespace megaton::pipeline
