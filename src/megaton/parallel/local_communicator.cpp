#include "megaton/parallel/local_communicator.h"

#include <cstring>

namespace megaton::parallel {

namespace {
struct Done final : Work {
  void wait() override {}
};

// out = in for a group of one (reduce-scatter, all-gather, all-to-all all reduce to this).
WorkHandle copy(const char* op, const Tensor& out, const Tensor& in) {
  if (out.dtype() != in.dtype() || out.numel() != in.numel())
    fail(op, ": output '", out.name(), "' (", out.numel(), " x ", dtype_name(out.dtype()), ") does not match input '",
         in.name(), "' (", in.numel(), " x ", dtype_name(in.dtype()), ") in a group of one");
  if (out.raw() != in.raw()) std::memcpy(out.raw(), in.raw(), in.nbytes());
  return completed_work();
}

void expect_self(const char* op, int rank) {
  if (rank != 0) fail(op, ": rank ", rank, " is not in a group of one");
}
}  // namespace

WorkHandle completed_work() {
  static const WorkHandle done = std::make_shared<Done>();
  return done;
}

WorkHandle LocalCommunicator::all_reduce_async(const Tensor&, ReduceOp) { return completed_work(); }

WorkHandle LocalCommunicator::reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp) {
  return copy("reduce_scatter", out, in);
}

WorkHandle LocalCommunicator::all_gather_async(const Tensor& out, const Tensor& in) {
  return copy("all_gather", out, in);
}

WorkHandle LocalCommunicator::all_to_all_async(const Tensor& out, std::span<const int64_t> out_counts, const Tensor& in,
                                               std::span<const int64_t> in_counts) {
  if (out_counts.size() != 1 || in_counts.size() != 1 || out_counts[0] != in_counts[0] ||
      in_counts[0] != in.numel())
    fail("all_to_all: counts do not describe one block of ", in.numel(), " elements in a group of one");
  return copy("all_to_all", out, in);
}

WorkHandle LocalCommunicator::broadcast_async(const Tensor&, int root) {
  expect_self("broadcast", root);
  return completed_work();
}

WorkHandle LocalCommunicator::send_async(const Tensor&, int peer, int) {
  fail("send to rank ", peer, ": a group of one has no peer");
}

WorkHandle LocalCommunicator::recv_async(const Tensor&, int peer, int) {
  fail("recv from rank ", peer, ": a group of one has no peer");
}

std::unique_ptr<Communicator> LocalCommunicator::split(int, int, const std::string& name) {
  return std::make_unique<LocalCommunicator>(name);
}

}  // namespace megaton::parallel
