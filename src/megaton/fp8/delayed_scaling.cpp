#include "megaton/fp8/delayed_scaling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "megaton/core/error.h"

namespace megaton::fp8 {

AmaxAlgo amax_algo_from_name(std::string_view name) {
  if (name == "max") return AmaxAlgo::Max;
  if (name == "most_recent") return AmaxAlgo::MostRecent;
  fail("unknown fp8_amax_compute_algo '", name, "' (expected max or most_recent)");
}

void DelayedScalingConfig::validate() const {
  if (margin < 0 || margin > 64) fail("fp8_margin must be in [0, 64], got ", margin);
  if (history_len < 1 || history_len > 65536) fail("fp8_amax_history_len must be in [1, 65536], got ", history_len);
}

DelayedScaling::DelayedScaling(Format format, DelayedScalingConfig config)
    : format_(format), config_(config), history_((config.validate(), static_cast<size_t>(config.history_len)), 0.0f) {}

void DelayedScaling::record(float amax) {
  float& slot = history_[head_];
  slot = std::isnan(amax) || std::isnan(slot) ? std::numeric_limits<float>::quiet_NaN() : std::max(slot, amax);
}

void DelayedScaling::update() {
  float amax = history_[head_];
  if (config_.algo == AmaxAlgo::Max)
    for (float a : history_) amax = std::isnan(a) || std::isnan(amax) ? std::numeric_limits<float>::quiet_NaN() : std::max(amax, a);
  if (std::isfinite(amax) && amax > 0.0f)  // a tiny amax must not make the scale inf (0 * inf is NaN)
    scale_ = std::min(std::ldexp(info(format_).max / amax, -config_.margin), std::numeric_limits<float>::max());
  head_ = (head_ + 1) % history_.size();
  history_[head_] = 0.0f;
}

std::vector<float> DelayedScaling::state() const {
  std::vector<float> s{scale_.value_or(0.0f)};
  for (size_t i = 1; i <= history_.size(); ++i) s.push_back(history_[(head_ + i) % history_.size()]);
  return s;
}

void DelayedScaling::load_state(const std::vector<float>& state) {
  if (state.size() != history_.size() + 1)
    fail("FP8 delayed-scaling state has ", state.size() - (state.empty() ? 0 : 1), " amax history entries, the run uses ",
         history_.size(), " (fp8_amax_history_len)");
  if (!(std::isfinite(state[0]) && state[0] >= 0.0f)) fail("FP8 delayed-scaling state holds an invalid scale ", state[0]);
  scale_ = state[0] > 0.0f ? std::optional<float>(state[0]) : std::nullopt;
  std::copy(state.begin() + 1, state.end(), history_.begin());
  head_ = history_.size() - 1;
}

}  // namespace megaton::fp8
