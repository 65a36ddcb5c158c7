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
#include "megaton/optim/optimizer.h"

namespace megaton::optim {

struct AdamWConfig {
  double lr = 3e-4;  // only a default for callers; step() takes the lr (it comes from the schedule)
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // applied only to parameters whose weight_decay flag is set
};

class AdamW final : public Optimizer {
 public:
  // Allocates zeroed fp32 moments (MemCategory::Optimizer) for every parameter up front, so the
  // memory accounting sees the optimizer's footprint before the first step.
  AdamW(nn::ParameterList params, AdamWConfig config);
  // Over a model's flat buffers: the moments are flat buffers of the same layout (per-parameter
  // views keep the checkpoint names), and each step runs over a few long contiguous runs of
  // parameters that share a weight-decay flag instead of one loop per parameter.
  AdamW(const nn::ParamAndGradBuffer& buffer, AdamWConfig config);
  // Over the elements `owned` of a model's flat buffers only (a distributed optimizer's shard:
  // ParamAndGradBuffer::shard_ranges): the moments exist for those elements alone (one flat pair,
  // MemCategory::Optimizer, the ranges back to back), the segments are the owned ranges cut by the
  // weight-decay runs, and each element's update is the one the whole-buffer AdamW makes, bitwise.
  // The ranges must be in increasing order, disjoint and inside the buffer.
  AdamW(const nn::ParamAndGradBuffer& buffer, AdamWConfig config, std::vector<nn::ElementRange> owned);

  // grad_scale multiplies every gradient first (the clipping coefficient, see clip_coefficient):
  // rounding is identical to scaling the grads in place and then stepping.
  void step(double lr, double grad_scale = 1.0) override;
  int64_t steps() const override { return steps_; }  // completed steps; the next step uses t = steps() + 1
  const AdamWConfig& config() const { return config_; }
  const nn::ParameterList& params() const { return params_; }

  // Whether the moments cover only some elements (the owned-ranges constructor with less than the
  // whole buffer): then there are no per-parameter moment tensors, only the flat owned ones.
  bool sharded() const { return sharded_; }
  // The owned ranges (buffer offsets) and the flat moments holding them back to back (over a buffer).
  const std::vector<nn::ElementRange>& owned() const { return owned_; }
  const Tensor& flat_exp_avg() const { return m_; }
  const Tensor& flat_exp_avg_sq() const { return v_; }

  // Moments of params()[i] (not when sharded()).
  const Tensor& exp_avg(size_t i) const;
  const Tensor& exp_avg_sq(size_t i) const;

  // "<param>.exp_avg" / "<param>.exp_avg_sq" for every parameter, in parameter order. The tensors
  // share storage with the optimizer state (for saving without a copy). Not when sharded().
  std::vector<std::pair<std::string, Tensor>> state_tensors() const;

  // Optimizer's full state: "<param>.exp_avg" / ".exp_avg_sq" for every parameter, in parameter
  // order. When sharded(), save_state writes the owned elements only (the rest of `into` is left
  // as it is: the distributed optimizer gathers it) and load_state reads the owned elements out of
  // the full tensors.
  std::vector<StateTensorSpec> state_specs() const override;
  void save_state(const std::vector<std::pair<std::string, Tensor>>& into) const override;
  void load_state(const std::map<std::string, Tensor>& tensors, int64_t step) override;

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
  std::vector<Tensor> exp_avg_;     // per parameter (views into the flat moments when over a buffer); empty when sharded
  std::vector<Tensor> exp_avg_sq_;
  // Over a buffer: the owned ranges, each parameter's buffer offset, and the flat moments.
  bool sharded_ = false;
  std::vector<nn::ElementRange> owned_;
  std::vector<int64_t> param_offsets_;
  Tensor m_, v_;
  std::vector<Segment> segments_;
  int64_t steps_ = 0;
};

}  // namespace megaton::optim
