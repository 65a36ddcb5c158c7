#include "megaton/pipeline/trace.h"

#include "megaton/core/atomic_file.h"

namespace megaton::pipeline {

void write_chrome_trace(const std::string& path, const std::vector<TraceRow>& rows, double us_per_unit,
                        const nlohmann::json& other) {
  nlohmann::json events = nlohmann::json::array();
  for (size_t r = 0; r < rows.size(); ++r) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", r}, {"args", {{"name", rows[r].name}}}});
    for (const TimedOp& t : rows[r].ops) {
      nlohmann::json args{{"microbatch", t.op.microbatch}, {"chunk", t.op.chunk}};
      if (t.op.kind == OpKind::ForwardBackward)
        args.update({{"backward_microbatch", t.op.backward_microbatch}, {"backward_chunk", t.op.backward_chunk}});
      events.push_back({{"name", op_name(t.op) + (t.with_weight ? "+W" : "")},
                        {"ph", "X"},
                        {"pid", r},
                        {"tid", 0},
                        {"ts", t.start * us_per_unit},
                        {"dur", (t.end - t.start) * us_per_unit},
                        {"args", args}});
    }
    for (const TraceSpan& sp : rows[r].spans)
      events.push_back({{"name", sp.name},
                        {"ph", "X"},
                        {"pid", r},
                        {"tid", 1},
                        {"ts", sp.start * us_per_unit},
                        {"dur", (sp.end - sp.start) * us_per_unit}});
  }
  write_file_atomically(path, nlohmann::json{{"traceEvents", events}, {"otherData", other}}.dump());
}

}  // namespace megaton::pipeline
