#include "megaton/train/train_state.h"

#include <algorithm>

#include "megaton/core/error.h"

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
      {"data", {{"consumed_samples", p.consumed_samples}, {"skipped_batches", p.skipped_batches},
                {"global_batch_size", cfg.global_batch_size}}},
      // The sample order is a pure function of (seed, stream position) and training draws no
      // other random numbers, so the seed is the whole RNG state.
      {"rng", {{"seed", cfg.seed}, {"generator", "numpy-mt19937 (GPTDataset indices)"}}},
      {"lr_schedule", {{"iteration", p.step}, {"rewind_lr_factor", p.lr_factor},
                       {"rewind_lr_steps", {p.lr_factor_from, p.lr_factor_until}}}},
      // Training is fp32, so model.safetensors holds the master weights.
      {"optimizer", {{"type", "adamw"}, {"steps", optimizer_steps}, {"master_weights", "model.safetensors"}}},
      {"rewind", {{"rewinds", p.rewinds}, {"recent_losses", p.recent.losses}, {"recent_grad_norms", p.recent.grad_norms}}},
      {"precision", nlohmann::json::object()},
      {"config", to_toml(cfg)},
  };
}

TrainProgress state_from_json(const nlohmann::json& j, const TrainConfig& cfg, const std::string& source,
                              int64_t* optimizer_steps) {
  TrainProgress p;
  try {
    p.step = j.at("step").get<int64_t>();
    const auto& data = j.at("data");
    p.consumed_samples = data.at("consumed_samples").get<int64_t>();
    p.skipped_batches = data.at("skipped_batches").get<std::vector<int64_t>>();
    const auto seed = j.at("rng").at("seed").get<int64_t>();
    if (seed != cfg.seed)
      fail("config key 'training.seed' is ", cfg.seed, " but ", source, " was trained with seed ", seed,
           " (the sample order derives from it)");
    p.lr_factor = j.at("lr_schedule").at("rewind_lr_factor").get<double>();
    const auto& lr_steps = j.at("lr_schedule").at("rewind_lr_steps");
    p.lr_factor_from = lr_steps.at(0).get<int64_t>();
    p.lr_factor_until = lr_steps.at(1).get<int64_t>();
    *optimizer_steps = j.at("optimizer").at("steps").get<int64_t>();
    const auto& rewind = j.at("rewind");
    p.rewinds = rewind.at("rewinds").get<int64_t>();
    p.recent.losses = rewind.at("recent_losses").get<std::deque<double>>();
    p.recent.grad_norms = rewind.at("recent_grad_norms").get<std::deque<double>>();
  } catch (const nlohmann::json::exception& e) {
    fail(source, ": ", e.what());
  }
  return p;
}

}  // namespace megaton::train
