// Megatron's distributed optimizer (ZeRO stage 1, `[parallel] use_distributed_optimizer`): each
// data-parallel rank keeps AdamW's moments for its shard of the weights only, so optimizer memory
// per rank is 1/dp of the plain optimizer's.
//
// Layout: the model's ParamAndGradBuffer is built with dp shards (every bucket padded to a multiple
// of 16 x dp elements and cut into dp equal contiguous shards); rank r owns shard r of every bucket.
// A step: each bucket's gradient is reduce-scattered (summed) over the group as soon as backward
// has finished it, so rank r holds the summed gradient of its shards (the rest of its gradient
// buffer keeps its own, unreduced values and is not read); the grad norm (train/training_step) is
// the square root of the ranks' sums of squares of their shards added over the group; the
// clipped AdamW update runs over the owned elements only, bitwise the update the whole-buffer AdamW
// makes there; then every bucket's weights are all-gathered in place, so every rank has the full
// updated weights for the next forward. With overlap_param_gather (Megatron's) the gathers are
// left in flight, issued in the order the forward needs them (the last bucket holds the first
// layers): the next forward waits for each bucket right before its first module uses it
// (wait_for), so the gathers of later layers overlap the compute of earlier ones.
//
// The routed experts' buckets (GradBucket::expert) are sharded, reduce-scattered and gathered
// over the expert-data-parallel group instead (the ranks holding the same experts), the buffer
// cutting them into that group's size of shards.
//
// The state seen by checkpoints and rewind points is layout-free (optim::Optimizer): the full
// per-parameter "<param>.exp_avg" / ".exp_avg_sq" tensors of plain AdamW. Saving gathers the
// shards (collective); loading copies each rank's owned elements out of the full tensors.
#pragma once
#include <map>
#include <vector>

#include "megaton/nn/param_and_grad_buffer.h"
#include "megaton/optim/adamw.h"
#include "megaton/optim/optimizer.h"
#include "megaton/parallel/communicator.h"

namespace megaton::parallel {

class DistributedOptimizer final : public optim::Optimizer {
 public:
  // buffer: the model's buffer, built with dp.size() shards (edp.size() for the expert buckets); it,
  // dp and edp (null: dp) must outlive this.
  DistributedOptimizer(const nn::ParamAndGradBuffer& buffer, optim::AdamWConfig config, Communicator& dp,
                       bool overlap_param_gather = false, Communicator* edp = nullptr);

  // Starts summing bucket `bucket`'s gradient over its group into this rank's shard of it. Every
  // rank issues the buckets in the same order. With a group of one, nothing to do.
  WorkHandle reduce_scatter_grads(size_t bucket);

  // The sharded AdamW update, then every bucket's weights all-gathered in place (collective;
  // left in flight under overlap_param_gather).
  void step(double lr, double grad_scale = 1.0) override;
  // Before `params` are read: waits for the gathers of their buckets still in flight and refreshes
  // those buckets' compute copies (the forward's refresh for weights that landed late).
  void wait_for(const nn::ParameterList& params) const;
  // Every bucket (wait_for of them all).
  void wait_for_weights() const override;
  bool weights_in_flight() const;
  // Seconds spent blocked in wait_for / wait_for_weights so far (the overlapped gathers' waits).
  double gather_wait_seconds() const { return gather_wait_s_; }
  int64_t steps() const override { return adamw_.steps(); }
  std::vector<optim::StateTensorSpec> state_specs() const override { return adamw_.state_specs(); }
  // Gathers every rank's moments into the full tensors (collective: every rank calls it and every
  // rank's `into` receives the full state), one bucket at a time through a bucket-sized buffer.
  void save_state(const std::vector<std::pair<std::string, Tensor>>& into) const override;
  void load_state(const std::map<std::string, Tensor>& tensors, int64_t step) override {
    adamw_.load_state(tensors, step);
  }

  const optim::AdamW& shard_optimizer() const { return adamw_; }  // this rank's elements
  const std::vector<nn::ElementRange>& owned() const { return adamw_.owned(); }

 private:
  void wait_for_bucket(size_t bucket) const;
  // The group bucket `bucket` is sharded over, and this rank's shard of it.
  Communicator& group_of(size_t bucket) const { return buffer_.buckets()[bucket].expert ? edp_ : dp_; }
  nn::ElementRange mine(size_t bucket) const { return buffer_.shard_range(bucket, group_of(bucket).rank()); }

  const nn::ParamAndGradBuffer& buffer_;
  Communicator& dp_;
  Communicator& edp_;
  optim::AdamW adamw_;
  bool overlap_param_gather_;
  std::map<const nn::Parameter*, size_t> bucket_of_;
  mutable std::vector<WorkHandle> gathers_;  // per bucket: in flight after step() (overlap only)
  mutable double gather_wait_s_ = 0;
};

}  // namespace megaton::parallel
