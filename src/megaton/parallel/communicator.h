// A group of processes that exchange tensors: the collectives and point-to-point operations
// distributed training needs, each blocking or asynchronous with a wait handle. MPI implements it
// for the CPU backend (mpi_communicator.h); a single process is a group of one (local_communicator.h);
// an NCCL implementation for CUDA tensors drops in behind the same interface.
//
// Ordering contract (MPI's and NCCL's): every member issues the group's operations in the same
// order. Asynchronous operations of one process start in the order they were issued, across all of
// its groups (collectives also finish in that order; a posted send or recv completes when its peer's
// matching operation arrives, so a ring of sends then receives does not deadlock), so a program
// whose ranks issue the same sequence cannot deadlock.
#pragma once
#include <memory>
#include <span>
#include <string>

#include "megaton/core/tensor.h"

namespace megaton::parallel {

enum class ReduceOp { Sum, Max, Min };

// An operation in flight. wait() returns when its output may be read and its input reused, and
// rethrows the operation's error; waiting twice is allowed.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};
using WorkHandle = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // What the group is for ("world", "dp", "tp", ...), in error messages and timers.
  virtual const std::string& name() const = 0;

  // Tensors are contiguous host tensors (CUDA tensors need the NCCL implementation). Reductions
  // take f32, f64, i32, i64 and bf16 (bf16 summed in f32); the others move any dtype.
  // In place: t = op over the group of t.
  virtual WorkHandle all_reduce_async(const Tensor& t, ReduceOp op) = 0;
  // out.numel() * size() == in.numel(): rank r gets block r of the reduction of `in`.
  virtual WorkHandle reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) = 0;
  // out.numel() == size() * in.numel(): block r of out is rank r's `in`.
  virtual WorkHandle all_gather_async(const Tensor& out, const Tensor& in) = 0;
  // Uneven all-to-all: rank r sends in_counts[p] elements of `in` (consecutive blocks in peer
  // order) to peer p and receives out_counts[p] elements from p into consecutive blocks of out.
  virtual WorkHandle all_to_all_async(const Tensor& out, std::span<const int64_t> out_counts, const Tensor& in,
                                      std::span<const int64_t> in_counts) = 0;
  // In place: every rank's t becomes root's t.
  virtual WorkHandle broadcast_async(const Tensor& t, int root) = 0;
  virtual WorkHandle send_async(const Tensor& t, int peer, int tag) = 0;
  virtual WorkHandle recv_async(const Tensor& t, int peer, int tag) = 0;
  virtual void barrier() = 0;
  // The ranks with the same color form a new group, ordered by key then by rank here.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  // Blocking forms.
  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum) { all_reduce_async(t, op)->wait(); }
  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::Sum) {
    reduce_scatter_async(out, in, op)->wait();
  }
  void all_gather(const Tensor& out, const Tensor& in) { all_gather_async(out, in)->wait(); }
  void all_to_all(const Tensor& out, std::span<const int64_t> out_counts, const Tensor& in,
                  std::span<const int64_t> in_counts) {
    all_to_all_async(out, out_counts, in, in_counts)->wait();
  }
  void broadcast(const Tensor& t, int root) { broadcast_async(t, root)->wait(); }
  void send(const Tensor& t, int peer, int tag) { send_async(t, peer, tag)->wait(); }
  void recv(const Tensor& t, int peer, int tag) { recv_async(t, peer, tag)->wait(); }
  // A scalar summed (or maxed, ...) over the group, for losses, counts and norms.
  double all_reduce_scalar(double v, ReduceOp op = ReduceOp::Sum);
};

// The process's world: MPI's COMM_WORLD when launched by mpirun / srun (an MPI launcher's
// environment is detected), else a group of one. Initialises MPI on first use; later calls return
// the same object. Lives until the process exits (MPI is finalised at exit).
Communicator& world();
// Whether this process runs under an MPI launcher with more than one rank (OpenMPI's
// OMPI_COMM_WORLD_SIZE, hydra's PMI_SIZE, or srun's SLURM_NTASKS with PMI / PMIx variables).
// Reads the environment only: MPI is not initialised.
bool launched_distributed();
// This process's rank in the launched job, from the launcher's environment (0 when not launched
// distributed): for messages before or without MPI.
int launched_rank();
// Ends every rank of the job now (MPI_Abort, not queued behind this process's pending operations),
// after an error on this one; exit(code) when alone or when MPI was never started (the launcher then
// ends the other ranks when this one exits non-zero).
[[noreturn]] void abort_job(int code);

}  // namespace megaton::parallel
