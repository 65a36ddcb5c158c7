#include "megaton/train/train_state.h"

#include <algorithm>

#include "megaton/core/error.h"
#include "megaton/core/json_integer.h"

namespace megaton::train {

int64_t TrainProgress::next_batch(int64_t batch_size) const {
  int64_t first = consumed_samples;
  while (std::find(skipped_batches.begin(), skipped_batches.end(), first) != skipped_batches.end()) first += batch_size;
  return first;
}

nlohmann::json state_to_json(const TrainProgress& p, const TrainConfig& cfg, int64_t optimizer_steps) {
  return {
      {"format", "megaton-train-state"},
      {"step", p.step},
      {"data",
       {{"consumed_samples", p.consumed_samples},
        {"skipped_batches", p.skipped_batches},
        {"global_batch_size", cfg.global_batch_size}}},
      // The sample order is a pure function of (seed, stream position) and training draws no
      // other random numbers, so the seed is the whole RNG state.
      {"rng", {{"seed", cfg.seed}, {"generator", "numpy-mt19937 (GPTDataset indices)"}}},
      // The schedule's position is the count of updates made (skipped FP16 steps do not advance it).
      {"lr_schedule",
       {{"updates", optimizer_steps},
        {"rewind_lr_factor", p.lr_factor},
        {"rewind_lr_steps", {p.lr_factor_from, p.lr_factor_until}}}},
      // Training is fp32, so model.safetensors holds the master weights.
      {"optimizer", {{"type", "adamw"}, {"steps", optimizer_steps}, {"master_weights", "model.safetensors"}}},
      {"rewind",
       {{"rewinds", p.rewinds}, {"recent_losses", p.recent.losses}, {"recent_grad_norms", p.recent.grad_norms}}},
      {"precision", p.loss_scaler.empty() ? nlohmann::json::object() : nlohmann::json{{"loss_scaler", p.loss_scaler}}},
      {"config", to_toml(cfg)},
  };
}

namespace {

// An integer of state.json in [lo, hi]: a count beyond what any run reaches would overflow the
// positions computed from it (next_batch). The error names the file and key.
int64_t integer_at(const nlohmann::json& v, const char* key, const std::string& source, int64_t lo = 0,
                   int64_t hi = int64_t{1} << 62) {
  return json_integer(v, source + ": '" + key + "'", lo, hi);
}

}  // namespace

TrainProgress state_from_json(const nlohmann::json& j, const TrainConfig& cfg, const std::string& source,
                              int64_t* optimizer_steps) {
  TrainProgress p;
  try {
    p.step = integer_at(j.at("step"), "step", source);
    const auto& data = j.at("data");
    p.consumed_samples = integer_at(data.at("consumed_samples"), "data.consumed_samples", source);
    for (const auto& b : data.at("skipped_batches").get<std::vector<nlohmann::json>>())
      p.skipped_batches.push_back(integer_at(b, "data.skipped_batches", source));
    const auto seed = integer_at(j.at("rng").at("seed"), "rng.seed", source, INT64_MIN, INT64_MAX);
    if (seed != cfg.seed)
      fail("config key 'training.seed' is ", cfg.seed, " but ", source, " was trained with seed ", seed,
           " (the sample order derives from it)");
    p.lr_factor = j.at("lr_schedule").at("rewind_lr_factor").get<double>();
    if (!(p.lr_factor > 0 && p.lr_factor <= 1))
      fail(source, ": 'lr_schedule.rewind_lr_factor' must be in (0, 1], got ", p.lr_factor);
    const auto& lr_steps = j.at("lr_schedule").at("rewind_lr_steps");
    p.lr_factor_from = integer_at(lr_steps.at(0), "lr_schedule.rewind_lr_steps", source);
    p.lr_factor_until = integer_at(lr_steps.at(1), "lr_schedule.rewind_lr_steps", source);
    *optimizer_steps = integer_at(j.at("optimizer").at("steps"), "optimizer.steps", source);
    const auto& rewind = j.at("rewind");
    p.rewinds = integer_at(rewind.at("rewinds"), "rewind.rewinds", source);
    p.recent.losses = rewind.at("recent_losses").get<std::deque<double>>();
    p.recent.grad_norms = rewind.at("recent_grad_norms").get<std::deque<double>>();
    if (const auto precision = j.find("precision"); precision != j.end() && precision->contains("loss_scaler"))
      p.loss_scaler = precision->at("loss_scaler").get<std::vector<double>>();
  } catch (const nlohmann::json::exception& e) {
    fail(source, ": ", e.what());
  }
  return p;
}

}  // namespace megaton::train
