#include "megaton/plan/search.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <tuple>
#include <optional>

#include "megaton/core/error.h"
#include "megaton/train/train_config.h"

namespace megaton::plan {

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// The pipeline schedules tried at pp > 1, as `--set` items.
std::vector<std::vector<std::string>> schedule_settings(int64_t pp) {
  if (pp == 1) return {{}};
  return {{"parallel.pipeline_schedule=\"1f1b\""},
          {"parallel.pipeline_schedule=\"interleaved\"", "parallel.virtual_pipeline_model_parallel_size=2"},
          {"parallel.pipeline_schedule=\"interleaved\"", "parallel.virtual_pipeline_model_parallel_size=4"},
          {"parallel.pipeline_schedule=\"zb-h1\""},
          {"parallel.pipeline_schedule=\"zb-h2\""},
          {"parallel.pipeline_schedule=\"zbv\""},
          {"parallel.pipeline_schedule=\"dualpipev\""}};
}

// Lightest first: the search keeps the first one that fits.
const std::vector<std::vector<std::string>> kRecompute = {
    {},
    {"training.recompute_granularity=\"selective\"", "training.recompute_modules=\"core_attn\""},
    {"training.recompute_granularity=\"full\"", "training.recompute_method=\"uniform\"",
     "training.recompute_num_layers=1"}};

// pp's stage layers: even when they divide, else Megatron's uneven first and last stages around
// ceil(L / pp) layers on every other rank (DeepSeek-V3's 61 layers on 16 stages); none when that
// leaves the first or last stage empty.
std::optional<std::vector<std::string>> stage_split(int64_t layers, int64_t pp) {
  if (layers % pp == 0) return std::vector<std::string>{};
  if (pp < 3) return std::nullopt;
  const int64_t middle = (layers + pp - 1) / pp, ends = layers - (pp - 2) * middle;
  const int64_t first = ends / 2, last = ends - first;
  if (first < 1) return std::nullopt;
  return std::vector<std::string>{"parallel.decoder_first_pipeline_num_layers=" + std::to_string(first),
                                  "parallel.decoder_last_pipeline_num_layers=" + std::to_string(last)};
}

std::string joined(const std::vector<std::string>& items) {
  std::string s;
  for (const std::string& i : items) s += (s.empty() ? "" : " ") + i;
  return s;
}

// What makes `a` faster than `b`: the breakdown component where it saves the most.
std::string why_faster(const StepPlan& a, const StepPlan& b) {
  const std::pair<const char*, double> diffs[] = {
      {"compute", b.compute_s - a.compute_s},       {"exposed tp/ep communication", b.comm_s - a.comm_s},
      {"pipeline bubble", b.bubble_s - a.bubble_s}, {"gradient sync", b.grad_sync_s - a.grad_sync_s},
      {"optimizer", b.optimizer_s - a.optimizer_s}, {"parameter gather", b.param_gather_s - a.param_gather_s}};
  const auto best = std::max_element(std::begin(diffs), std::end(diffs),
                                     [](const auto& x, const auto& y) { return x.second < y.second; });
  char buf[160];
  std::snprintf(buf, sizeof buf, "%.1f%% faster than the next: %.4f s less %s",
                100 * (b.step_time_s / a.step_time_s - 1), best->second, best->first);
  return buf;
}

}  // namespace

SearchResult search(const SearchSpace& space, const SystemSpec& s, size_t top) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> base = space.base_settings;
  base.push_back("training.seq_length=" + std::to_string(space.seq_length));
  base.push_back("training.global_batch_size=" + std::to_string(space.global_batch));
  const train::TrainConfig model_only = train::load_train_config("", base);
  const models::TransformerConfig& m = model_only.model;
  const bool moe = m.mlp_type == "moe";
  const double budget = (1.0 - space.memory_margin) * s.memory_bytes;
  SearchResult result;
  std::vector<Candidate> fits;
  // The op lists of each (schedule, stages, chunks per stage, micro-batches), generated once.
  std::map<std::tuple<std::string, int64_t, int64_t, int64_t>, pipeline::Schedule> schedules;
  for (int64_t tp : divisors(space.devices)) {
    if (tp > s.devices_per_node || m.num_attention_heads % tp != 0) continue;
    for (int64_t pp : divisors(space.devices / tp)) {
      const auto split = stage_split(m.num_layers, pp);
      if (pp > m.num_layers || !split) continue;
      const int64_t dp = space.devices / tp / pp;
      for (int64_t ep : moe ? divisors(tp * dp) : std::vector<int64_t>{1}) {
        if (moe && m.moe.num_moe_experts % ep != 0) continue;
        for (int64_t mbs : {1, 2, 4, 8, 16}) {
          if (space.global_batch % (mbs * dp) != 0) continue;
          for (const auto& sched : schedule_settings(pp)) {
            std::vector<std::string> sets = base;
            sets.insert(sets.end(), {"tp=" + std::to_string(tp), "pp=" + std::to_string(pp), "ep=" + std::to_string(ep),
                                     "training.micro_batch_size=" + std::to_string(mbs),
                                     std::string("parallel.sequence_parallel=") + (tp > 1 ? "true" : "false"),
                                     std::string("parallel.use_distributed_optimizer=") + (dp > 1 ? "true" : "false")});
            sets.insert(sets.end(), split->begin(), split->end());
            sets.insert(sets.end(), sched.begin(), sched.end());
            for (const auto& rc : kRecompute) {
              std::vector<std::string> all = sets;
              all.insert(all.end(), rc.begin(), rc.end());
              StepPlan p;
              try {
                train::TrainConfig c = train::load_train_config("", all);
                train::resolve_parallel_layout(c, space.devices);
                const auto key = std::make_tuple(c.pipeline_schedule, pp, train::pipeline_chunks_per_rank(c),
                                                 c.grad_accum_steps());
                auto it = schedules.find(key);
                if (it == schedules.end()) it = schedules.emplace(key, step_schedule(c)).first;
                p = plan_step(c, s, &it->second);
              } catch (const Error&) {
                break;  // a layout the engine refuses (heads, layers per chunk, micro-batches per schedule...)
              }
              ++result.planned;
              if (p.peak_memory_bytes > budget) continue;  // try the next heavier recompute
              std::vector<std::string> shown(all.begin() + static_cast<std::ptrdiff_t>(base.size()), all.end());
              fits.push_back({joined(shown), std::move(p), ""});
              break;
            }
          }
        }
      }
    }
  }
  result.fitting = fits.size();
  std::sort(fits.begin(), fits.end(),
            [](const Candidate& a, const Candidate& b) { return a.plan.step_time_s < b.plan.step_time_s; });
  if (fits.size() > top) fits.resize(top);
  for (size_t i = 0; i < fits.size(); ++i)
    fits[i].why = i + 1 < fits.size() ? why_faster(fits[i].plan, fits[i + 1].plan) : "";
  result.best = std::move(fits);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

nlohmann::json to_json(const SearchResult& r, const SystemSpec& s) {
  nlohmann::json best = nlohmann::json::array();
  for (const Candidate& c : r.best)
    best.push_back({{"settings", c.settings},
                    {"step_time_s", c.plan.step_time_s},
                    {"tokens_per_s", c.plan.tokens_per_s},
                    {"mfu", c.plan.mfu},
                    {"peak_memory_bytes", c.plan.peak_memory_bytes},
                    {"why", c.why}});
  return {{"system", s.name}, {"planned", r.planned}, {"fitting", r.fitting}, {"seconds", r.seconds}, {"best", best}};
}

}  // namespace megaton::plan
