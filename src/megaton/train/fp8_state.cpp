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

Fp8StateSnapshot::Fp8StateSnapshot(const models::TransformerModel& model) {
  for (const auto& [name, state] : named_states(model)) {
    const auto n = static_cast<int64_t>(state->state().size());
    states_.emplace_back(name, Tensor::zeros({n}, DType::F32, MemCategory::Other, name));
  }
}

void Fp8StateSnapshot::capture(const models::TransformerModel& model) {
  const auto named = named_states(model);
  MEGATON_CHECK(named.size() == states_.size(), "FP8 state snapshot of ", states_.size(), " states, the model has ",
                named.size());
  for (size_t i = 0; i < named.size(); ++i) {
    const std::vector<float> v = named[i].second->state();
    MEGATON_CHECK(static_cast<int64_t>(v.size()) == states_[i].second.numel(), "FP8 state '", named[i].first,
                  "' changed size");
    std::copy(v.begin(), v.end(), states_[i].second.data<float>());
  }
}

void Fp8StateSnapshot::restore(models::TransformerModel& model) const {
  const auto states = writable_states(model);
  MEGATON_CHECK(states.size() == states_.size(), "FP8 state snapshot of ", states_.size(), " states, the model has ",
                states.size());
  for (size_t i = 0; i < states.size(); ++i) states[i]->load_state(values_of(states_[i].second));
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
  if (saved.size() != named.size())
    fail(path, ": ", saved.size(), " FP8 delayed-scaling states, the model has ", named.size(),
         " (FP8 on other layers when it was written)");
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
