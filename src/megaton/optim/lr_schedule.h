// Learning-rate schedule with the semantics of Megatron-LM's OptimizerParamScheduler.get_lr
// (init_lr = 0), for lr_decay_style "constant", "linear" and "cosine":
//   step <= warmup_steps (warmup_steps > 0):  max_lr * step / warmup_steps
//   constant, after warmup:                   max_lr (min_lr and decay_steps unused)
//   step > decay_steps:                       min_lr
//   otherwise, ratio = (step - warmup_steps) / (decay_steps - warmup_steps):
//     linear: min_lr + (max_lr - min_lr) * (1 - ratio)
//     cosine: min_lr + (max_lr - min_lr) * 0.5 * (cos(pi * ratio) + 1)
// The trainer calls lr_at(n) for the n-th update (1-based) and logs that value, so a warmup's
// first update already moves the weights. Megatron's scheduler instead advances after each
// update, so its n-th update runs at lr_at(n - 1) (its first warmup update at lr 0) while its log
// shows lr_at(n). The end-to-end checks pin Megaton's choice against an independent schedule.
#pragma once
#include <cstdint>
#include <string_view>

namespace megaton::optim {

enum class LRDecayStyle { Constant, Linear, Cosine };

// Parses Megatron's lr_decay_style names; throws naming the unknown value and the valid ones.
LRDecayStyle lr_decay_style_from_name(std::string_view name);
std::string_view lr_decay_style_name(LRDecayStyle style);

struct LRSchedule {
  double max_lr = 3e-4;
  double min_lr = 0;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 1;  // step at which decay reaches min_lr (Megatron's lr_decay_iters)
  LRDecayStyle style = LRDecayStyle::Cosine;

  // Throws on settings Megatron rejects: min_lr < 0, max_lr < min_lr, warmup_steps < 0, and (for a
  // decaying style) decay_steps <= warmup_steps; also on step < 0.
  double lr_at(int64_t step) const;
};

}  // namespace megaton::optim
