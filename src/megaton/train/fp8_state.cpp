#include "megaton/train/fp8_state.h"

#include <cstdio>
#include <filesystem>
#include <map>

#include "megaton/ckpt/safetensors.h"

namespace megaton::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFp8StateFile = "fp8_state.safetensors";

// Every delayed-scaling state of the model with its name, in the model's layer order.
std::vector<std::pair<std::string, const fp8::DelayedScaling*>> named_states(const models::TransformerModel& model) {
  std::vector<std::pair<std::string, const fp8::DelayedScaling*>> out;
  for (const fp8::LinearQuantizer* q : model.fp8_quantizers())
    for (auto& named : q->named_delayed_states()) out.push_back(std::move(named));
  return out;
}

// The writable states, in named_states' order.
std::vector<fp8::DelayedScaling*> writable_states(models::TransformerModel& model) {
  std::vector<fp8::DelayedScaling*> out;
  for (fp8::LinearQuantizer* q : model.fp8_quantizers())
    for (fp8::DelayedScaling* s : q->delayed_states()) out.push_back(s);
  return out;
}

std::vector<float> values_of(const Tensor& t) {
  const float* v = t.data<float>();
  return {v, v + t.numel()};
}

}  // namespace

Fp8StateSnapshot::Fp8StateSnapshot(const models::TransformerModel& live, models::TransformerModel& whole) {
  const auto& setting = live.fp8_setting();
  if (!setting) return;
  whole.enable_fp8(setting->config, setting->first_layer, setting->end_layer);
  const auto named = named_states(whole);
  int64_t total = 0;
  for (const auto& [name, state] : named) total += static_cast<int64_t>(state->state().size());
  flat_ = Tensor::zeros({total}, DType::F32, MemCategory::Other, "fp8_state");
  int64_t offset = 0;
  for (const auto& [name, state] : named) {
    const auto n = static_cast<int64_t>(state->state().size());
    index_.emplace(name, states_.size());
    states_.emplace_back(name, flat_.window(offset, {n}, name));
    offset += n;
  }
}

void Fp8StateSnapshot::capture(const models::TransformerModel& live) {
  if (states_.empty()) return;
  std::fill(flat_.data<float>(), flat_.data<float>() + flat_.numel(), 0.0f);
  for (const auto& [name, state] : named_states(live)) {
    const std::vector<float> v = state->state();
    const Tensor& dst = states_.at(index_.at(name)).second;
    MEGATON_CHECK(static_cast<int64_t>(v.size()) == dst.numel(), "FP8 state '", name, "' changed size");
    std::copy(v.begin(), v.end(), dst.data<float>());
  }
  const models::StageLayout& layout = live.stage_layout();
  if (layout.split()) layout.group->all_reduce(flat_);
}

void Fp8StateSnapshot::restore(models::TransformerModel& live) const {
  const auto named = named_states(live);
  const auto states = writable_states(live);
  for (size_t i = 0; i < named.size(); ++i) states[i]->load_state(values_of(states_.at(index_.at(named[i].first)).second));
}

void Fp8StateSnapshot::write(const std::string& dir) const {
  if (states_.empty()) return;
  ckpt::save_safetensors((fs::path(dir) / kFp8StateFile).string(), states_, {{"format", "megaton-fp8-delayed-scaling"}});
}

void load_fp8_state(const std::string& dir, models::TransformerModel& model) {
  const auto named = named_states(model);
  if (named.empty()) return;  // no delayed scaling in this run: a saved state is not needed
  const std::string path = (fs::path(dir) / kFp8StateFile).string();
  if (!fs::exists(path)) {
    std::fprintf(stderr,
                 "warning: %s has no FP8 delayed-scaling state (written without it): the amax histories start "
                 "afresh, so this run is not bitwise the uninterrupted one\n",
                 dir.c_str());
    return;
  }
  const auto saved = ckpt::load_safetensors(path);
  const auto states = writable_states(model);
  for (size_t i = 0; i < named.size(); ++i) {
    const auto it = saved.find(named[i].first);
    if (it == saved.end()) fail(path, ": missing FP8 state '", named[i].first, "'");
    if (it->second.dtype() != DType::F32 || it->second.dim() != 1)
      fail(path, ": FP8 state '", named[i].first, "' must be a 1-d F32 tensor, got ", dtype_name(it->second.dtype()),
           " ", shape_str(it->second.shape()));
    try {
      states[i]->load_state(values_of(it->second));
    } catch (const Error& e) {
      fail(path, ": '", named[i].first, "': ", e.what());
    }
  }
}

}  // namespace megaton::train
