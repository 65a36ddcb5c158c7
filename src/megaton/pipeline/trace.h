// Chrome traces (chrome://tracing, Perfetto) of pipeline ops: one process row per entry of `rows`
// (a simulated stage, or a rank of a training run), each op a complete event ("ph": "X") named
// as op_name prints it ("+W" when its W ran in the same call), with its micro-batch and chunk.
// `megaton schedule --trace` writes the simulated timeline, a run with logging.trace the measured one.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megaton/pipeline/simulator.h"

namespace megaton::pipeline {

// A named interval outside the op list (the planner's gradient reduction, optimizer step).
struct TraceSpan {
  std::string name;
  double start, end;
};

struct TraceRow {
  std::string name;  // "stage 0", "rank 1 (pp 1)", ...
  std::vector<TimedOp> ops;
  std::vector<TraceSpan> spans{};  // drawn on a second thread row of the process
};

// Writes PATH atomically; op times are multiplied by us_per_unit (seconds: 1e6). `other` goes to
// the trace's "otherData".
void write_chrome_trace(const std::string& path, const std::vector<TraceRow>& rows, double us_per_unit,
                        const nlohmann::json& other);

}  // namespace megaton::pipeline
