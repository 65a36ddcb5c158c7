#include "megaton/train/step_undo.h"

#include <cstring>
#include <map>

namespace megaton::train {

StepUndo::StepUndo(const nn::ParamAndGradBuffer& buffer, const optim::Optimizer& optimizer)
    : buffer_(buffer),
      weights_(Tensor::empty(buffer.weights().shape(), buffer.weights().dtype(), MemCategory::Optimizer,
                             "post_validation.weights")) {
  for (const optim::StateTensorSpec& s : optimizer.state_specs())
    state_.emplace_back(s.name, Tensor::empty(s.shape, DType::F32, MemCategory::Optimizer, "post_validation." + s.name));
}

void StepUndo::capture(const optim::Optimizer& optimizer) {
  const Tensor& w = buffer_.weights();
  std::memcpy(weights_.raw(), w.raw(), w.nbytes());
  optimizer.save_state(state_);
  steps_ = optimizer.steps();
}

void StepUndo::undo(optim::Optimizer& optimizer) const {
  const Tensor& w = buffer_.weights();
  std::memcpy(w.raw(), weights_.raw(), w.nbytes());
  optimizer.load_state(std::map<std::string, Tensor>(state_.begin(), state_.end()), steps_);
}

}  // namespace megaton::train
