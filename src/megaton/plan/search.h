// `megaton plan --search`: every layout the engine would accept for a model on N devices, planned
// and ranked. Enumerates tp (dividing the heads, within a node), pp (dividing the layers), ep
// (dividing the experts and the stage's tp x dp ranks), micro-batch sizes, the pipeline schedules
// (1f1b, interleaved with 2 and 4 chunks, zb-h1, zb-h2, zbv, dualpipev), sequence parallelism and
// the distributed optimizer, and activation recompute (none, selective core_attn, full) taken
// only when the lighter setting does not fit; each candidate is validated by the training
// config's own checks (so every printed layout is a runnable `--set` list), planned
// (step_plan.h), dropped when its largest rank's peak memory exceeds (1 - margin) of a device's,
// and the rest ranked by tokens/s.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megaton/plan/step_plan.h"
#include "megaton/plan/system.h"

namespace megaton::plan {

struct SearchSpace {
  int64_t devices = 1;
  int64_t global_batch = 1;
  int64_t seq_length = 4096;
  double memory_margin = 0.1;
  std::vector<std::string> base_settings;  // model.preset=..., precision, ... (train --set form)
};

struct Candidate {
  std::string settings;  // the `--set` list that runs it
  StepPlan plan;
  std::string why;       // what sets it apart from the next one in the ranking
};

struct SearchResult {
  size_t planned = 0, fitting = 0;
  double seconds = 0;
  std::vector<Candidate> best;  // fastest first
};

SearchResult search(const SearchSpace& space, const SystemSpec& s, size_t top);
nlohmann::json to_json(const SearchResult& r, const SystemSpec& s);

}  // namespace megaton::plan
