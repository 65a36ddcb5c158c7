// AdamW with torch.optim.AdamW semantics (decoupled weight decay, bias-corrected moments).
//
// Per step t (1-based), for every parameter p with gradient g:
//   p -= lr * wd * p                       (only if p.weight_decay; decoupled from the gradient)
//   m  = b1 * m + (1 - b1) * g
//   v  = b2 * v + (1 - b2) * g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
//
// The optimizer reads grads as they are: gradient accumulation over micro-batches is the trainer's
// job. Kernels accumulate weight grads with += and the trainer scales each micro-batch loss by
// 1/num_microbatches, so after the last backward the grads hold the mean over the global batch;
// the trainer then clips (grad_clip.h), calls step(), and zeroes the grads.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "megaton/core/tensor.h"
#include "megaton/nn/param_and_grad_buffer.h"
#include "megaton/nn/parameter.h"

namespace megaton::optim {

struct AdamWConfig {
  double lr = 3e-4;  // only a default for callers; step() takes the lr (it comes from the schedule)
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // applied only to parameters whose weight_decay flag is set
};

class AdamW {
 public:
  // Allocates zeroed fp32 moments (MemCategory::Optimizer) for every parameter up front, so the
  // memory accounting sees the optimizer's footprint before the first step.
  AdamW(nn::ParameterList params, AdamWConfig config);
  // Over a model's flat buffers: the moments are flat buffers of the same layout (per-parameter
  // views keep the checkpoint names), and each step runs over a few long contiguous runs of
  // parameters that share a weight-decay flag instead of one loop per parameter.
  AdamW(const nn::ParamAndGradBuffer& buffer, AdamWConfig config);

  // grad_scale multiplies every gradient first (the clipping coefficient, see clip_coefficient):
  // rounding is identical to scaling the grads in place and then stepping.
  void step(double lr, double grad_scale = 1.0);
  int64_t steps() const { return steps_; }  // completed steps; the next step uses t = steps() + 1
  const AdamWConfig& config() const { return config_; }
  const nn::ParameterList& params() const { return params_; }

  // Moments of params()[i].
  const Tensor& exp_avg(size_t i) const { return exp_avg_.at(i); }
  const Tensor& exp_avg_sq(size_t i) const { return exp_avg_sq_.at(i); }

  // "<param>.exp_avg" / "<param>.exp_avg_sq" for every parameter, in parameter order. The tensors
  // share storage with the optimizer state (for saving without a copy).
  std::vector<std::pair<std::string, Tensor>> state_tensors() const;
  // Restores every moment by the names state_tensors() gives (converting dtype if needed) and the
  // step count. Throws naming the key when one is missing or has the wrong shape; keys that are not
  // optimizer state are ignored, so a whole checkpoint's map can be passed.
  void load_state(const std::map<std::string, Tensor>& tensors, int64_t step);

 private:
  // A contiguous run of elements updated with one weight-decay setting: views of the weights,
  // grads and both moments over the same elements.
  struct Segment {
    Tensor w, g, m, v;
    bool decay;
  };
  void check_config_and_names() const;

  nn::ParameterList params_;
  AdamWConfig config_;
  std::vector<Tensor> exp_avg_;     // per parameter (views into the flat moments when over a buffer)
  std::vector<Tensor> exp_avg_sq_;
  std::vector<Segment> segments_;
  int64_t steps_ = 0;
};

}  // namespace megaton::optim
