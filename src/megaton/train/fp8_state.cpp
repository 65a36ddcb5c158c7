#include "megaton/train/fp8_state.h"

#include <cstdio>

namespace megaton::train {

namespace {

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

Fp8StateSnapshot::Fp8StateSnapshot(const models::TransformerModel& live) {
  const auto named = named_states(live);
  int64_t total = 0;
  for (const auto& [name, state] : named) total += static_cast<int64_t>(state->state().size());
  if (total == 0) return;
  flat_ = Tensor::zeros({total}, DType::F32, MemCategory::Other, "fp8_state");
  int64_t offset = 0;
  for (const auto& [name, state] : named) {
    const auto n = static_cast<int64_t>(state->state().size());
    states_.emplace_back(name, flat_.window(offset, {n}, name));
    offset += n;
  }
}

void Fp8StateSnapshot::capture(const models::TransformerModel& live) {
  const auto named = named_states(live);
  MEGATON_CHECK(named.size() == states_.size(), "the model's FP8 states changed in number");
  for (size_t i = 0; i < named.size(); ++i) {
    const std::vector<float> v = named[i].second->state();
    const Tensor& dst = states_[i].second;
    MEGATON_CHECK(static_cast<int64_t>(v.size()) == dst.numel(), "FP8 state '", named[i].first, "' changed size");
    std::copy(v.begin(), v.end(), dst.data<float>());
  }
}

void Fp8StateSnapshot::restore(models::TransformerModel& live) const {
  const auto states = writable_states(live);
  for (size_t i = 0; i < states.size(); ++i) states[i]->load_state(values_of(states_[i].second));
}

void load_fp8_state(ckpt::ShardedReader& reader, const std::string& prefix, models::TransformerModel& model) {
  const auto named = named_states(model);
  if (named.empty()) return;  // no delayed scaling in this run: a saved state is not needed
  if (!reader.has(prefix + named.front().first)) {
    std::fprintf(stderr,
                 "warning: %s has no FP8 delayed-scaling state (written without it): the amax histories start "
                 "afresh, so this run is not bitwise the uninterrupted one\n",
                 reader.dir().c_str());
    return;
  }
  const auto states = writable_states(model);
  for (size_t i = 0; i < named.size(); ++i) {
    const std::string name = prefix + named[i].first;
    const Tensor saved = reader.read_whole(name, MemCategory::Other);
    if (saved.dtype() != DType::F32 || saved.dim() != 1)
      fail(reader.dir(), ": FP8 state '", name, "' must be a 1-d f32 tensor, got ", dtype_name(saved.dtype()), " ",
           shape_str(saved.shape()));
    try {
      states[i]->load_state(values_of(saved));
    } catch (const Error& e) {
      fail(reader.dir(), ": FP8 state '", name, "': ", e.what());
    }
  }
}

}  // namespace megaton::train
