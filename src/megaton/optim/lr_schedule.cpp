#include "megaton/optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "megaton/core/error.h"

namespace megaton::optim {

LRDecayStyle lr_decay_style_from_name(std::string_view name) {
  if (name == "constant") return LRDecayStyle::Constant;
  if (name == "linear") return LRDecayStyle::Linear;
  if (name == "cosine") return LRDecayStyle::Cosine;
  fail("unknown lr_decay_style '", name, "' (valid: constant, linear, cosine)");
}

std::string_view lr_decay_style_name(LRDecayStyle style) {
  switch (style) {
    case LRDecayStyle::Constant:
      return "constant";
    case LRDecayStyle::Linear:
      return "linear";
    case LRDecayStyle::Cosine:
      return "cosine";
  }
  fail("invalid LRDecayStyle value ", static_cast<int>(style));
}

double LRSchedule::lr_at(int64_t step) const {
  MEGATON_CHECK(min_lr >= 0, "lr schedule min_lr must be >= 0, got ", min_lr);
  MEGATON_CHECK(max_lr >= min_lr, "lr schedule max_lr ", max_lr, " is below min_lr ", min_lr);
  MEGATON_CHECK(warmup_steps >= 0, "lr schedule warmup_steps must be >= 0, got ", warmup_steps);
  MEGATON_CHECK(style == LRDecayStyle::Constant || decay_steps > warmup_steps, "lr schedule decay_steps ", decay_steps,
                " must exceed warmup_steps ", warmup_steps, " for lr_decay_style ", lr_decay_style_name(style));
  MEGATON_CHECK(step >= 0, "lr schedule queried at step ", step);

  if (warmup_steps > 0 && step <= warmup_steps)
    return max_lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
  if (style == LRDecayStyle::Constant) return max_lr;
  if (step > decay_steps) return min_lr;
  const double ratio = static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps - warmup_steps);
  const double coeff = style == LRDecayStyle::Linear ? 1.0 - ratio : 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
  return min_lr + coeff * (max_lr - min_lr);
}

}  // namespace megaton::optim
