// A Communicator over an MPI communicator, for host tensors (the CPU backend's collectives).
//
// One progress thread per process makes every MPI call of the process, MPI_Init_thread and
// MPI_Finalize included (so MPI runs at MPI_THREAD_SERIALIZED). Operations are queued and executed
// strictly in issue order: a collective is one blocking MPI call on that thread, so an
// asynchronous collective runs while the calling thread computes; a send or recv is posted there in
// issue order (MPI_Isend / MPI_Irecv) and completes in the background, polled by the same thread
// between operations, so that a ring of sends followed by receives cannot deadlock on blocking
// sends. Blocking forms (barrier, split and the Communicator's blocking wrappers) queue an
// operation and wait for it like any other. While a collective waits for its peers, Open MPI polls
// on the progress thread (yielding when oversubscribed): that thread takes CPU time from the
// computation it overlaps with.
//
// Arguments are checked on the calling thread, before anything is queued: host tensors only,
// matching dtypes and sizes, counts that fit MPI's int counts; errors name the operation, the group
// and the tensor. MPI errors (returned, not fatal: MPI_ERRORS_RETURN) are rethrown by wait() with
// MPI_Error_string's text, the operation, the group and the ranks.
#pragma once
#include <mpi.h>

#include <cstdint>

#include "megaton/parallel/communicator.h"

namespace megaton::parallel {

class MpiCommunicator final : public Communicator {
 public:
  // Wraps `comm`; MPI must already be running (world() starts it when launched distributed).
  // An owned communicator is freed (MPI_Comm_free, queued) when this object is destroyed.
  MpiCommunicator(MPI_Comm comm, std::string name, bool owned);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  WorkHandle all_reduce_async(const Tensor& t, ReduceOp op) override;
  WorkHandle reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) override;
  WorkHandle all_gather_async(const Tensor& out, const Tensor& in) override;
  WorkHandle all_to_all_async(const Tensor& out, std::span<const int64_t> out_counts, const Tensor& in,
                              std::span<const int64_t> in_counts) override;
  WorkHandle broadcast_async(const Tensor& t, int root) override;
  WorkHandle send_async(const Tensor& t, int peer, int tag) override;
  WorkHandle recv_async(const Tensor& t, int peer, int tag) override;
  void barrier() override;
  // MPI_Comm_split; a negative color is an error (every rank joins some group).
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

 private:
  // "all_reduce on group 'dp' (rank 1 of 4)": the start of every message about `op`.
  std::string where(const char* op) const;

  MPI_Comm comm_;
  std::string name_;
  bool owned_;
  int rank_ = 0;
  int size_ = 1;
};

// The most elements one MPI call moves: INT_MAX (MPI's counts are int), lowered by tests to
// exercise the large-tensor paths. all_reduce, broadcast, send and recv move larger tensors in
// several calls of at most this many elements; reduce_scatter, all_gather and all_to_all refuse
// blocks (and all_to_all totals) above it.
void set_mpi_max_count_for_tests(int64_t max_count);
int64_t mpi_max_count();

}  // namespace megaton::parallel
