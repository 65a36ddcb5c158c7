// `megaton schedule`: a pipeline schedule's op lists run through the simulator with given costs:
// an ASCII timeline per stage, step time, bubble fraction and activation peaks; --json prints the
// figures as one object, --trace writes a Chrome trace (chrome://tracing, Perfetto).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "megaton/pipeline/trace.h"
#include "option_range.h"
#include "megaton/core/error.h"
#include "megaton/pipeline/generators.h"
#include "megaton/pipeline/simulator.h"

namespace megaton::app {

namespace {

// "F=2,B=1,W=1[,T=0.1][,FB=2.5]": per-op costs of one model chunk and micro-batch; T is the
// transfer, FB an overlapped F&B (DualPipe; F + B unless given).
pipeline::OpCosts parse_costs(const std::string& text) {
  pipeline::OpCosts c;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto eq = item.find('=');
    double* field = nullptr;
    const std::string key = item.substr(0, eq);
    if (key == "F") field = &c.forward;
    if (key == "B") field = &c.backward_input;
    if (key == "W") field = &c.backward_weight;
    if (key == "T") field = &c.transfer;
    if (key == "FB") field = &c.forward_backward;
    if (eq == std::string::npos || !field)
      fail("--costs: '", item, "' is not one of F=, B=, W=, T=, FB= with a number");
    double v = 0;
    try {
      size_t used = 0;
      v = std::stod(item.substr(eq + 1), &used);
      if (used != item.size() - eq - 1) throw std::invalid_argument("trailing text");
    } catch (const std::exception&) {
      fail("--costs: '", item, "' is not a number");
    }
    if (!std::isfinite(v) || v < 0 || (key != "T" && v == 0) || v > 1e9)
      fail("--costs: ", key, " = ", v, " is out of range (F, B, W, FB in (0, 1e9], T in [0, 1e9])");
    *field = v;
  }
  return c;
}

// One row per stage; each column is `unit` of time, three characters wide; an op is labelled
// with its name, idle time is dots.
std::string timeline(const pipeline::Simulation& sim, double unit) {
  std::string out;
  for (size_t st = 0; st < sim.timeline.size(); ++st) {
    std::string row;
    double t = 0;
    auto cells = [unit](double d) { return static_cast<size_t>(std::llround(d / unit)) * 3; };
    for (const pipeline::TimedOp& op : sim.timeline[st]) {
      row.append(cells(op.start - t), '.');
      std::string label = pipeline::op_name(op.op);
      label.resize(std::max<size_t>(cells(op.end - op.start), 1), ' ');
      row += label;
      t = op.end;
    }
    out += "stage " + std::to_string(st) + " |" + row + "|\n";
  }
  return out;
}

}  // namespace

void add_schedule_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("schedule", "Simulate a pipeline schedule: timeline per stage, step time, bubble "
                                             "fraction, activation peaks");
  static std::string kind = "1f1b", costs_text = "F=1,B=1,W=1", trace;
  static int pp = 4, vpp = 1;
  static int64_t microbatches = 8;
  static bool json = false;
  std::string kinds;
  for (const auto& k : pipeline::schedule_kinds()) kinds += (kinds.empty() ? "" : ", ") + k;
  cmd->add_option("--kind", kind, "Schedule: " + kinds)->capture_default_str();
  cmd->add_option("--pp", pp, "Pipeline stages")->capture_default_str()->check(in_range(1, 4096));
  cmd->add_option("--vpp", vpp, "Model chunks per stage (interleaved; 2 for zbv, dualpipe, dualpipev)")
      ->capture_default_str()
      ->check(in_range(1, 1024));
  cmd->add_option("--microbatches", microbatches, "Micro-batches per step")
      ->capture_default_str()
      ->check(in_range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--costs", costs_text,
                  "Per-op costs F=,B=,W=, the stage-to-stage transfer T= and an overlapped F&B FB= (default F+B)")
      ->capture_default_str();
  cmd->add_flag("--json", json, "Print the figures as one JSON object");
  cmd->add_option("--trace", trace, "Write a Chrome trace (JSON) of the simulated ops to this file");
  cmd->callback([] {
    const pipeline::OpCosts costs = parse_costs(costs_text);
    const pipeline::Schedule s = pipeline::generate(kind, pp, vpp, microbatches);
    const pipeline::Simulation sim = pipeline::simulate(s, costs);
    if (!trace.empty()) {
      std::vector<pipeline::TraceRow> rows;
      for (size_t st = 0; st < sim.timeline.size(); ++st) rows.push_back({"stage " + std::to_string(st), sim.timeline[st]});
      pipeline::write_chrome_trace(trace, rows, 1000, {{"schedule", s.name}});  // one cost unit drawn as 1 ms
    }
    if (json) {
      std::printf("%s\n", nlohmann::json{{"schedule", s.name}, {"stages", s.stages}, {"chunks", s.chunks_per_stage},
                                         {"microbatches", s.microbatches}, {"step_time", sim.step_time},
                                         {"bubble_fraction", sim.bubble_fraction},
                                         {"peak_activations", sim.peak_activations}, {"param_copies", sim.param_copies}}
                              .dump()
                              .c_str());
      return;
    }
    double unit = std::min({costs.forward, costs.backward_input, costs.backward_weight});
    if (costs.forward_backward > 0) unit = std::min(unit, costs.forward_backward);
    std::printf("%s, %d stages x %d chunks, %ld micro-batches, costs %s (one column = %g)\n%s", s.name.c_str(),
                s.stages, s.chunks_per_stage, static_cast<long>(s.microbatches), costs_text.c_str(), unit,
                timeline(sim, unit).c_str());
    const auto joined = [](const std::vector<int>& values) {
      std::string out;
      for (int v : values) out += (out.empty() ? "" : " ") + std::to_string(v);
      return out;
    };
    std::printf("step time %g | bubble %.1f%% | peak activations per stage (micro-batch chunks): %s | parameter "
                "copies per stage: %s\n",
                sim.step_time, 100.0 * sim.bubble_fraction, joined(sim.peak_activations).c_str(),
                joined(sim.param_copies).c_str());
  });
}

}  // namespace megaton::app
