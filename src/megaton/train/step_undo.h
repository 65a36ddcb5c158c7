// What one optimizer step changes on this rank (its flat main weights, the optimizer's state and
// step count), copied before a step so that the step can be undone bitwise. Zero Bubble's optimizer
// post-validation (parallel.optimizer_post_validation) steps each pipeline stage as soon as its own
// gradients are final, before the global grad norm and the inf/NaN decision are known, and undoes
// the step where they would have changed it (clipping) or skipped it (a non-finite norm); the step
// is then taken again, or skipped, as without post-validation. Buffers are allocated once.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "megaton/nn/param_and_grad_buffer.h"
#include "megaton/optim/optimizer.h"

namespace megaton::train {

class StepUndo {
 public:
  // buffer: the gradient buffer whose weights the optimizer updates; it must outlive this.
  StepUndo(const nn::ParamAndGradBuffer& buffer, const optim::Optimizer& optimizer);
  void capture(const optim::Optimizer& optimizer);  // before the step
  void undo(optim::Optimizer& optimizer) const;      // back to the capture
 private:
  const nn::ParamAndGradBuffer& buffer_;
  Tensor weights_;
  std::vector<std::pair<std::string, Tensor>> state_;
  int64_t steps_ = 0;
};

}  // namespace megaton::train
