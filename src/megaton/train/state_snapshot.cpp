#include "megaton/train/state_snapshot.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>

#include "megaton/ckpt/safetensors.h"
#include "megaton/core/atomic_file.h"
#include "megaton/core/regular_file.h"
#include "megaton/models/hf_format.h"
#include "megaton/models/tensor_parallel_weights.h"
#include "megaton/nn/tensor_shards.h"

namespace megaton::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kStateFile = "state.json";
// The moments have each parameter's Megaton layout (model.safetensors is HF's, whatever Megaton's
// is). Version 2: linear_qkv's rows in Megatron's per-query-group layout; files without a version
// hold them as [all q | all k | all v] and must not be loaded as if they were per group.
constexpr const char* kOptimizerVersion = "2";

// memcpy in 1 MiB chunks across threads: one thread does not saturate memory bandwidth, and
// this copy is what a save stalls the step for.
void copy_bytes(const Tensor& src, const Tensor& dst) {
  MEGATON_CHECK(src.nbytes() == dst.nbytes(), "snapshot of '", src.name(), "': size changed");
  constexpr int64_t kChunk = int64_t{1} << 20;
  const auto n = static_cast<int64_t>(src.nbytes());
  const auto* s = static_cast<const char*>(src.raw());
  auto* d = static_cast<char*>(dst.raw());
#pragma omp parallel for schedule(static) if (n > 4 * kChunk)
  for (int64_t c = 0; c < (n + kChunk - 1) / kChunk; ++c)
    std::memcpy(d + c * kChunk, s + c * kChunk, static_cast<size_t>(std::min(kChunk, n - c * kChunk)));
}

// to's value = from's (either may be split over its group: gathered, then sliced).
void copy_value(const nn::Parameter& from, const nn::TensorParallel& from_tp, const nn::Parameter& to) {
  if (nn::holds_global(from) && nn::holds_global(to))
    copy_bytes(from.value, to.value);
  else
    nn::slice_global(to, nn::gather_global(from, from.value, from_tp), to.value);
}

// The parameter whose moment `state_name` ("<param>.exp_avg" / ".exp_avg_sq") is.
const nn::Parameter& moment_param(const models::TransformerModel& model, const std::string& state_name) {
  for (const nn::Parameter* p : model.parameters())
    if (state_name.starts_with(p->name + ".")) return *p;
  fail("optimizer state '", state_name, "' belongs to no parameter of the model");
}

}  // namespace

StateSnapshot::StateSnapshot(const models::TransformerModel& model, const optim::Optimizer& optimizer)
    : model_(model.config()), tp_(model.tensor_parallel()), fp8_(model) {
  for (nn::Parameter* p : model_.parameters()) p->grad = Tensor();  // only the values are kept
  for (const auto& [name, shape] : optimizer.state_specs()) {
    const nn::Parameter& p = moment_param(model, name);
    // Touched now, not in the first save.
    const Tensor global = Tensor::zeros(nn::global_shape(p), DType::F32, MemCategory::Optimizer, name);
    moments_.emplace_back(name, global);
    local_moments_.emplace_back(
        name, nn::holds_global(p) ? global : Tensor::zeros(shape, DType::F32, MemCategory::Optimizer, name));
    moment_params_.push_back(&p);
  }
}

void StateSnapshot::capture(const models::TransformerModel& model, const optim::Optimizer& optimizer,
                            const TrainProgress& progress, const TrainConfig& cfg) {
  const auto& from = model.parameters();
  const auto& to = model_.parameters();
  for (size_t i = 0; i < from.size(); ++i) copy_value(*from[i], tp_, *to[i]);
  optimizer.save_state(local_moments_);
  for (size_t i = 0; i < moments_.size(); ++i)
    if (!nn::holds_global(*moment_params_[i]))
      copy_bytes(nn::gather_global(*moment_params_[i], local_moments_[i].second, tp_), moments_[i].second);
  optimizer_steps_ = optimizer.steps();
  fp8_.capture(model);
  progress_ = progress;
  state_ = state_to_json(progress, cfg, optimizer_steps_);
}

void StateSnapshot::restore(models::TransformerModel& model, optim::Optimizer& optimizer) const {
  const auto& from = model_.parameters();
  const auto& to = model.parameters();
  for (size_t i = 0; i < from.size(); ++i) copy_value(*from[i], {}, *to[i]);
  for (size_t i = 0; i < moments_.size(); ++i)
    if (!nn::holds_global(*moment_params_[i]))
      nn::slice_global(*moment_params_[i], moments_[i].second, local_moments_[i].second);
  optimizer.load_state({local_moments_.begin(), local_moments_.end()}, optimizer_steps_);
  fp8_.restore(model);
}

void StateSnapshot::write_model(const std::string& dir) { models::save_hf_model(model_, dir); }

void StateSnapshot::write_optimizer_and_state(const std::string& dir) const {
  ckpt::save_safetensors(
      (fs::path(dir) / kOptimizerFile).string(), moments_,
      {{"format", "megaton-adamw"}, {"version", kOptimizerVersion}, {"steps", std::to_string(optimizer_steps_)}});
  fp8_.write(dir);
  AtomicFile out((fs::path(dir) / kStateFile).string());
  const std::string text = state_.dump(2) + "\n";
  out.write(text.data(), text.size());
  out.commit();
}

TrainProgress load_checkpoint(const std::string& dir, models::TransformerModel& model, optim::Optimizer& optimizer,
                              const TrainConfig& cfg) {
  const std::string model_file = (fs::path(dir) / "model.safetensors").string();
  const std::string state_file = (fs::path(dir) / kStateFile).string();
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(read_regular_file(state_file, "training state"));
  } catch (const nlohmann::json::exception& e) {
    fail(state_file, ": ", e.what());
  }
  int64_t optimizer_steps = 0;
  TrainProgress progress = state_from_json(state, cfg, state_file, &optimizer_steps);
  const std::string optimizer_file = (fs::path(dir) / kOptimizerFile).string();
  std::map<std::string, std::string> metadata;
  const auto moments = ckpt::load_safetensors(optimizer_file, &metadata);
  const auto version = metadata.find("version");
  if (version == metadata.end() || version->second != kOptimizerVersion)
    fail(optimizer_file, ": optimizer state version ", version == metadata.end() ? "1" : version->second,
         ", this build reads version ", kOptimizerVersion,
         " (linear_qkv moments in Megatron's per-query-group layout, not [q | k | v]); to continue without the "
         "optimizer state, start a new run with model.load=",
         dir);
  // The files hold the global tensors: a split model takes its slices of them.
  if (model.tensor_parallel().active()) {
    models::TransformerModel whole(model.config());
    models::load_hf_tensors(whole, ckpt::load_safetensors(model_file), model_file);
    models::copy_weights(whole, model);
  } else {
    models::load_hf_tensors(model, ckpt::load_safetensors(model_file), model_file);
  }
  std::map<std::string, Tensor> local = moments;
  for (const auto& spec : optimizer.state_specs()) {
    const nn::Parameter& p = moment_param(model, spec.name);
    const auto it = moments.find(spec.name);
    if (nn::holds_global(p) || it == moments.end()) continue;  // a missing one is the optimizer's error
    if (it->second.shape() != nn::global_shape(p))
      fail(optimizer_file, ": optimizer state '", spec.name, "' has shape ", shape_str(it->second.shape()),
           ", expected ", shape_str(nn::global_shape(p)));
    local[spec.name] = Tensor::empty(spec.shape, DType::F32, MemCategory::Optimizer, spec.name);
    nn::slice_global(p, it->second.to(DType::F32, MemCategory::Workspace), local[spec.name]);
  }
  try {
    optimizer.load_state(local, optimizer_steps);
  } catch (const Error& e) {
    fail(optimizer_file, ": ", e.what());
  }
  load_fp8_state(dir, model);
  return progress;
}

}  // namespace megaton::train
