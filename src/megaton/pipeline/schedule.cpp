#include "megaton/pipeline/schedule.h"

#include <set>
#include <utility>

#include "megaton/core/error.h"

namespace megaton::pipeline {

OpParts compute_parts(const Op& op) {
  OpParts parts;
  switch (op.kind) {
    case OpKind::Forward:
    case OpKind::BackwardInput:
    case OpKind::BackwardWeight:
      parts.ops[parts.count++] = op;
      break;
    case OpKind::ForwardBackward:
      parts.ops[parts.count++] = {OpKind::Forward, op.microbatch, op.chunk};
      parts.ops[parts.count++] = {OpKind::BackwardInput, op.backward_microbatch, op.backward_chunk};
      break;
    default:
      break;
  }
  return parts;
}

std::string op_name(const Op& op) {
  static constexpr const char* names[] = {"F", "B", "W", "sendF", "recvF", "sendB", "recvB"};
  const auto name = [](const char* kind, int64_t microbatch, int chunk) {
    std::string s = kind + std::to_string(microbatch);
    if (chunk != 0) s += '.' + std::to_string(chunk);
    return s;
  };
  if (op.kind == OpKind::ForwardBackward)
    return name("F", op.microbatch, op.chunk) + '&' + name("B", op.backward_microbatch, op.backward_chunk);
  return name(names[static_cast<size_t>(op.kind)], op.microbatch, op.chunk);
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

namespace {

// Every (copy, model chunk) held by exactly one (stage, chunk), and each table shaped stages x chunks.
void validate_placement(const Schedule& s) {
  MEGATON_CHECK(s.copies >= 1 && s.chunks_per_stage % s.copies == 0 && s.microbatches % s.copies == 0,
                "schedule '", s.name, "' keeps ", s.copies, " parameter copies; the chunks per stage (",
                s.chunks_per_stage, ") and micro-batches (", s.microbatches, ") must be multiples of it");
  MEGATON_CHECK(s.copies == 1 ? s.chunk_copy.empty() : s.chunk_copy.size() == static_cast<size_t>(s.stages),
                "schedule '", s.name, "': chunk_copy lists ", s.chunk_copy.size(), " stages for ", s.copies,
                " copies (one row per stage with more than one copy, none with one)");
  MEGATON_CHECK(s.model_chunk.empty() || s.model_chunk.size() == static_cast<size_t>(s.stages), "schedule '", s.name,
                "': model_chunk lists ", s.model_chunk.size(), " stages for ", s.stages);
  std::set<std::pair<int, int>> held;  // (copy, model chunk)
  for (int st = 0; st < s.stages; ++st) {
    for (const auto* table : {&s.model_chunk, &s.chunk_copy}) {
      const size_t listed = table->empty() ? 0 : (*table)[static_cast<size_t>(st)].size();
      MEGATON_CHECK(table->empty() || listed == static_cast<size_t>(s.chunks_per_stage), "schedule '", s.name,
                    "' stage ", st, ": chunk placement lists ", listed, " chunks for ", s.chunks_per_stage);
    }
    for (int c = 0; c < s.chunks_per_stage; ++c) {
      const int copy = s.copy_of(st, c), mc = s.model_chunk_of(st, c);
      MEGATON_CHECK(copy >= 0 && copy < s.copies && mc >= 0 && mc < s.model_chunks(), "schedule '", s.name,
                    "' stage ", st, " chunk ", c, ": copy ", copy, " model chunk ", mc, " out of range (", s.copies,
                    " copies of ", s.model_chunks(), " model chunks)");
      MEGATON_CHECK(held.insert({copy, mc}).second, "schedule '", s.name, "' stage ", st, " chunk ", c,
                    ": model chunk ", mc, " of copy ", copy, " is held twice");
    }
  }
}

}  // namespace

void validate(const Schedule& s) {
  MEGATON_CHECK(s.stages >= 1 && s.chunks_per_stage >= 1 && s.microbatches >= 1, "schedule '", s.name,
                "' has ", s.stages, " stages, ", s.chunks_per_stage, " chunks per stage and ", s.microbatches,
                " micro-batches; each must be at least 1");
  MEGATON_CHECK(s.ops.size() == static_cast<size_t>(s.stages), "schedule '", s.name, "' lists ", s.ops.size(),
                " stages' ops for ", s.stages, " stages");
  validate_placement(s);
  for (int st = 0; st < s.stages; ++st) {
    // Per (micro-batch, chunk): how many of F, B, W have run so far, in that order.
    std::vector<int> done(static_cast<size_t>(s.microbatches * s.chunks_per_stage), 0);
    for (const Op& whole : s.ops[static_cast<size_t>(st)])
      for (const Op& op : compute_parts(whole)) {
        const auto where = [&] {
          return "schedule '" + s.name + "' stage " + std::to_string(st) + " op " + op_name(whole);
        };
        MEGATON_CHECK(op.microbatch >= 0 && op.microbatch < s.microbatches, where(), ": micro-batch out of range [0, ",
                      s.microbatches, ")");
        MEGATON_CHECK(op.chunk >= 0 && op.chunk < s.chunks_per_stage, where(), ": chunk out of range [0, ",
                      s.chunks_per_stage, ")");
        MEGATON_CHECK(s.runs(st, op.chunk, op.microbatch), where(), ": micro-batch ", op.microbatch, " runs on copy ",
                      s.copy_of_microbatch(op.microbatch), ", chunk ", op.chunk, " is copy ", s.copy_of(st, op.chunk));
        const int order = op.kind == OpKind::Forward ? 0 : op.kind == OpKind::BackwardInput ? 1 : 2;
        int& n = done[static_cast<size_t>(op.microbatch * s.chunks_per_stage + op.chunk)];
        MEGATON_CHECK(n == order, where(), ": expected ", n == 0 ? "F" : n == 1 ? "B" : n == 2 ? "W" : "nothing more",
                      " next for micro-batch ", op.microbatch, " chunk ", op.chunk);
        ++n;
      }
    for (int64_t m = 0; m < s.microbatches; ++m)
      for (int c = 0; c < s.chunks_per_stage; ++c) {
        if (!s.runs(st, c, m)) continue;
        const int n = done[static_cast<size_t>(m * s.chunks_per_stage + c)];
        MEGATON_CHECK(n == 3, "schedule '", s.name, "' stage ", st, ": micro-batch ", m, " chunk ", c, " stops after ",
                      n, " of its F, B, W");
      }
  }
}

}  // namespace megaton::pipeline
