// A group of one process: every collective is a copy or nothing, and point-to-point has no peer.
// What a single-process run talks to, so training code has one path for any world size.
#pragma once
#include "megaton/parallel/communicator.h"

namespace megaton::parallel {

class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(std::string name = "world") : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  WorkHandle all_reduce_async(const Tensor& t, ReduceOp op) override;
  WorkHandle reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) override;
  WorkHandle all_gather_async(const Tensor& out, const Tensor& in) override;
  WorkHandle all_to_all_async(const Tensor& out, std::span<const int64_t> out_counts, const Tensor& in,
                              std::span<const int64_t> in_counts) override;
  WorkHandle broadcast_async(const Tensor& t, int root) override;
  WorkHandle send_async(const Tensor& t, int peer, int tag) override;
  WorkHandle recv_async(const Tensor& t, int peer, int tag) override;
  void barrier() override {}
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

 private:
  std::string name_;
};

// A finished operation: wait() returns at once.
WorkHandle completed_work();

}  // namespace megaton::parallel
