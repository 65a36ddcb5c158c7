#include "megaton/parallel/distributed_optimizer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "megaton/parallel/local_communicator.h"

namespace megaton::parallel {

namespace {

std::vector<nn::ElementRange> owned_ranges(const nn::ParamAndGradBuffer& buffer, const Communicator& dp,
                                           const Communicator& edp) {
  if (buffer.shards() != dp.size() || buffer.expert_shards() != edp.size())
    fail("distributed optimizer over group '", dp.name(), "' of ", dp.size(), " ranks (experts: '", edp.name(), "' of ",
         edp.size(), ") needs a gradient buffer with as many shards, it has ", buffer.shards(), " (",
         buffer.expert_shards(), ")");
  return buffer.shard_ranges(dp.rank(), edp.rank());
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(const nn::ParamAndGradBuffer& buffer, optim::AdamWConfig config,
                                           Communicator& dp, bool overlap_param_gather, Communicator* edp)
    : buffer_(buffer),
      dp_(dp),
      edp_(edp ? *edp : dp),
      adamw_(buffer, config, owned_ranges(buffer, dp, edp_)),
      overlap_param_gather_(overlap_param_gather),
      gathers_(buffer.buckets().size()) {
  for (size_t b = 0; b < buffer.buckets().size(); ++b)
    for (const nn::Parameter* p : buffer.buckets()[b].params) bucket_of_.emplace(p, b);
  MEGATON_CHECK(buffer.weights().device().is_cpu(), "the distributed optimizer runs on host tensors (MPI), the buffer is on ",
                buffer.weights().device().str());
}

WorkHandle DistributedOptimizer::reduce_scatter_grads(size_t bucket) {
  Communicator& group = group_of(bucket);
  if (group.size() == 1) return completed_work();
  const nn::GradBucket& b = buffer_.buckets().at(bucket);
  const nn::ElementRange shard = mine(bucket);
  const std::string name = "grad_bucket_" + std::to_string(bucket);
  return group.reduce_scatter_async(buffer_.grads().window(shard.offset, {shard.numel}, name + "_shard"),
                                    buffer_.grads().window(b.offset, {b.numel}, name), ReduceOp::Sum);
}

void DistributedOptimizer::step(double lr, double grad_scale) {
  wait_for_weights();  // the previous step's gathers land before this one writes its shards
  adamw_.step(lr, grad_scale);
  // The last bucket first: it holds the first layers, which the next forward needs first.
  for (size_t b = buffer_.buckets().size(); b-- > 0;) {
    Communicator& group = group_of(b);
    if (group.size() == 1) continue;
    const nn::GradBucket& bucket = buffer_.buckets()[b];
    const nn::ElementRange shard = mine(b);
    const std::string name = "param_bucket_" + std::to_string(b);
    gathers_[b] = group.all_gather_async(buffer_.weights().window(bucket.offset, {bucket.numel}, name),
                                         buffer_.weights().window(shard.offset, {shard.numel}, name + "_shard"));
  }
  if (!overlap_param_gather_)
    for (WorkHandle& work : gathers_)
      if (work) std::exchange(work, nullptr)->wait();
}

void DistributedOptimizer::wait_for_bucket(size_t bucket) const {
  if (!gathers_[bucket]) return;
  const auto t0 = std::chrono::steady_clock::now();
  std::exchange(gathers_[bucket], nullptr)->wait();
  gather_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nn::refresh_compute_copies(buffer_.buckets()[bucket].params);
}

void DistributedOptimizer::wait_for(const nn::ParameterList& params) const {
  for (const nn::Parameter* p : params)
    if (const auto it = bucket_of_.find(p); it != bucket_of_.end()) wait_for_bucket(it->second);
}

void DistributedOptimizer::wait_for_weights() const {
  for (size_t b = buffer_.buckets().size(); b-- > 0;) wait_for_bucket(b);
}

bool DistributedOptimizer::weights_in_flight() const {
  return std::any_of(gathers_.begin(), gathers_.end(), [](const WorkHandle& w) { return w != nullptr; });
}

void DistributedOptimizer::save_state(const std::vector<std::pair<std::string, Tensor>>& into) const {
  const auto specs = state_specs();
  MEGATON_CHECK(into.size() == specs.size(), "distributed optimizer state saved into ", into.size(),
                " tensors, it has ", specs.size());
  for (size_t s = 0; s < specs.size(); ++s)
    MEGATON_CHECK(into[s].second.shape() == specs[s].shape && into[s].second.dtype() == DType::F32 &&
                      into[s].second.device().is_cpu(),
                  "distributed optimizer state '", specs[s].name, "' saved into '", into[s].first, "' (",
                  dtype_name(into[s].second.dtype()), " ", shape_str(into[s].second.shape()), "), expected f32 ",
                  shape_str(specs[s].shape), " on the host");
  int64_t largest = 0;
  for (const nn::GradBucket& b : buffer_.buckets()) largest = std::max(largest, b.numel);
  const Tensor staging[2] = {Tensor::empty({largest}, DType::F32, MemCategory::Workspace, "exp_avg_gather"),
                             Tensor::empty({largest}, DType::F32, MemCategory::Workspace, "exp_avg_sq_gather")};
  const Tensor* flat[2] = {&adamw_.flat_exp_avg(), &adamw_.flat_exp_avg_sq()};
  size_t param = 0;      // index of the bucket's first parameter (buckets hold the parameters in buffer order)
  int64_t local = 0;     // where this rank's shard of the bucket starts in the flat moments
  for (size_t b = 0; b < buffer_.buckets().size(); ++b) {
    const nn::GradBucket& bucket = buffer_.buckets()[b];
    const nn::ElementRange shard = mine(b);
    Communicator& group = group_of(b);
    std::vector<WorkHandle> gathers;
    for (int which = 0; which < 2; ++which) {
      const Tensor whole = staging[which].window(0, {bucket.numel}, staging[which].name());
      const Tensor block = staging[which].window(shard.offset - bucket.offset, {shard.numel}, staging[which].name());
      std::memcpy(block.data<float>(), flat[which]->data<float>() + local, static_cast<size_t>(shard.numel) * sizeof(float));
      if (group.size() > 1) gathers.push_back(group.all_gather_async(whole, block));
    }
    for (auto& work : gathers) work->wait();
    for (const nn::Parameter* p : bucket.params) {
      const int64_t at = buffer_.offset_of(*p) - bucket.offset;
      for (int which = 0; which < 2; ++which) {
        const Tensor& dst = into[2 * param + which].second;
        std::memcpy(dst.data<float>(), staging[which].data<float>() + at, static_cast<size_t>(dst.numel()) * sizeof(float));
      }
      ++param;
    }
    local += shard.numel;
  }
}

}  // namespace megaton::parallel
