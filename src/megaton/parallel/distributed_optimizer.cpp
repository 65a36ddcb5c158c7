#include "megaton/parallel/distributed_optimizer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "megaton/parallel/local_communicator.h"

namespace megaton::parallel {

namespace {

std::vector<nn::ElementRange> owned_ranges(const nn::ParamAndGradBuffer& buffer, const Communicator& dp) {
  if (buffer.shards() != dp.size())
    fail("distributed optimizer over group '", dp.name(), "' of ", dp.size(), " ranks needs a gradient buffer with ",
         dp.size(), " shards, it has ", buffer.shards());
  return buffer.shard_ranges(dp.rank());
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(const nn::ParamAndGradBuffer& buffer, optim::AdamWConfig config,
                                           Communicator& dp, bool overlap_param_gather)
    : buffer_(buffer),
      dp_(dp),
      adamw_(buffer, config, owned_ranges(buffer, dp)),
      overlap_param_gather_(overlap_param_gather),
      gathers_(buffer.buckets().size()) {
  for (size_t b = 0; b < buffer.buckets().size(); ++b)
    for (const nn::Parameter* p : buffer.buckets()[b].params) bucket_of_.emplace(p, b);
  MEGATON_CHECK(buffer.weights().device().is_cpu(), "the distributed optimizer runs on host tensors (MPI), the buffer is on ",
                buffer.weights().device().str());
}

WorkHandle DistributedOptimizer::reduce_scatter_grads(size_t bucket) {
  if (dp_.size() == 1) return completed_work();
  const nn::GradBucket& b = buffer_.buckets().at(bucket);
  const nn::ElementRange mine = buffer_.shard_range(bucket, dp_.rank());
  const std::string name = "grad_bucket_" + std::to_string(bucket);
  return dp_.reduce_scatter_async(buffer_.grads().window(mine.offset, {mine.numel}, name + "_shard"),
                                  buffer_.grads().window(b.offset, {b.numel}, name), ReduceOp::Sum);
}

void DistributedOptimizer::step(double lr, double grad_scale) {
  wait_for_weights();  // the previous step's gathers land before this one writes its shards
  adamw_.step(lr, grad_scale);
  if (dp_.size() == 1) return;
  // The last bucket first: it holds the first layers, which the next forward needs first.
  for (size_t b = buffer_.buckets().size(); b-- > 0;) {
    const nn::GradBucket& bucket = buffer_.buckets()[b];
    const nn::ElementRange mine = buffer_.shard_range(b, dp_.rank());
    const std::string name = "param_bucket_" + std::to_string(b);
    gathers_[b] = dp_.all_gather_async(buffer_.weights().window(bucket.offset, {bucket.numel}, name),
                                       buffer_.weights().window(mine.offset, {mine.numel}, name + "_shard"));
  }
  if (!overlap_param_gather_)
    for (WorkHandle& work : gathers_) std::exchange(work, nullptr)->wait();
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
    const nn::ElementRange mine = buffer_.shard_range(b, dp_.rank());
    std::vector<WorkHandle> gathers;
    for (int which = 0; which < 2; ++which) {
      const Tensor whole = staging[which].window(0, {bucket.numel}, staging[which].name());
      const Tensor block = staging[which].window(mine.offset - bucket.offset, {mine.numel}, staging[which].name());
      std::memcpy(block.data<float>(), flat[which]->data<float>() + local, static_cast<size_t>(mine.numel) * sizeof(float));
      if (dp_.size() > 1) gathers.push_back(dp_.all_gather_async(whole, block));
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
    local += mine.numel;
  }
}

}  // namespace megaton::parallel
