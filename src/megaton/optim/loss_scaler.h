// Dynamic loss scaling for FP16 training (Megatron's DynamicGradScaler; `initial_loss_scale`,
// `min_loss_scale`, `loss_scale_window`, `hysteresis`): the loss is multiplied by scale() before
// backward so small fp16 gradients do not flush to zero; the gradients are divided by it before
// clipping and the update. A step whose gradients hold inf or NaN is skipped (no update), and after
// `hysteresis` such steps in a row without an intervening growth the scale halves (never below
// min_loss_scale); after `loss_scale_window` clean steps in a row it doubles.
// A fixed scale (Megatron's `loss_scale`) never changes and never skips.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

namespace megaton::optim {

struct LossScalerConfig {
  double initial_scale = 4294967296.0;  // 2^32, Megatron's initial_loss_scale
  double min_scale = 1.0;
  int64_t window = 1000;                 // clean steps before growing
  int hysteresis = 2;                    // overflowing steps tolerated before backing off
  std::optional<double> fixed_scale = std::nullopt;  // Megatron's loss_scale: static scaling
  void validate() const;                 // names the key that is out of range
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerConfig config);
  double scale() const { return scale_; }
  // After backward: whether the gradients were finite. Returns true when the step must be skipped.
  bool update(bool grads_finite);
  int64_t skipped_steps() const { return skipped_; }

  // scale, growth tracker, hysteresis tracker, skipped steps: restored bitwise on resume.
  std::vector<double> state() const;
  void load_state(const std::vector<double>& state);

 private:
  LossScalerConfig config_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int hysteresis_tracker_;
  int64_t skipped_ = 0;
};

}  // namespace megaton::optim
