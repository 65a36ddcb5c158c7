#include "megaton/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "megaton/core/error.h"

namespace megaton::optim {

namespace {
// A scale must stay a finite power-of-two-friendly fp32 value: 2^-24 .. 2^64 covers every use.
constexpr double kMinScale = 0x1p-24, kMaxScale = 0x1p64;
bool in_range(double s) { return std::isfinite(s) && s >= kMinScale && s <= kMaxScale; }
}  // namespace

void LossScalerConfig::validate() const {
  if (fixed_scale && !in_range(*fixed_scale)) fail("precision.loss_scale must be in [2^-24, 2^64], got ", *fixed_scale);
  if (!in_range(initial_scale)) fail("precision.initial_loss_scale must be in [2^-24, 2^64], got ", initial_scale);
  if (!in_range(min_scale) || min_scale > initial_scale)
    fail("precision.min_loss_scale must be in [2^-24, initial_loss_scale], got ", min_scale);
  if (window < 1 || window > (int64_t{1} << 31)) fail("precision.loss_scale_window must be in [1, 2^31], got ", window);
  if (hysteresis < 1 || hysteresis > 1000000) fail("precision.hysteresis must be in [1, 10^6], got ", hysteresis);
}

LossScaler::LossScaler(LossScalerConfig config)
    : config_((config.validate(), config)),
      scale_(config.fixed_scale.value_or(config.initial_scale)),
      hysteresis_tracker_(config.hysteresis) {}

bool LossScaler::update(bool grads_finite) {
  if (config_.fixed_scale) return false;
  if (!grads_finite) {
    ++skipped_;
    growth_tracker_ = 0;
    if (--hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * 0.5, config_.min_scale);
    return true;
  }
  if (++growth_tracker_ == config_.window) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = config_.hysteresis;
    scale_ = std::min(scale_ * 2.0, kMaxScale);
  }
  return false;
}

std::vector<double> LossScaler::state() const {
  return {scale_, static_cast<double>(growth_tracker_), static_cast<double>(hysteresis_tracker_),
          static_cast<double>(skipped_)};
}

void LossScaler::load_state(const std::vector<double>& s) {
  if (s.size() != 4) fail("loss scaler state has ", s.size(), " values, expected 4");
  if (!in_range(s[0])) fail("loss scaler state holds an invalid scale ", s[0]);
  for (size_t i = 1; i < 4; ++i)
    if (!(s[i] >= -1e6 && s[i] <= 0x1p62 && s[i] == std::floor(s[i])))
      fail("loss scaler state value ", i, " is not a count: ", s[i]);
  scale_ = s[0];
  growth_tracker_ = static_cast<int64_t>(s[1]);
  hysteresis_tracker_ = static_cast<int>(std::max(-1e6, std::min(s[2], 1e6)));
  skipped_ = static_cast<int64_t>(s[3]);
}

}  // namespace megaton::optim
