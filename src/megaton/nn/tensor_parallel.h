// The tensor-parallel group a module is built for (Megatron-Core's tensor model parallelism): the
// group its weights are split over and the collectives of its forward and backward run on, and
// whether activations outside the column / row-parallel pairs are split along the sequence
// (sequence parallelism). A default TensorParallel is no parallelism: every module then runs
// exactly its single-process code.
#pragma once
#include <vector>

#include "megaton/nn/parameter.h"
#include "megaton/parallel/communicator.h"

namespace megaton::nn {

struct TensorParallel {
  parallel::Communicator* group = nullptr;  // null: a group of one
  bool sequence_parallel = false;            // only meaningful with more than one rank

  int size() const { return group ? group->size() : 1; }
  int rank() const { return group ? group->rank() : 0; }
  bool active() const { return size() > 1; }
  // Sequence parallelism in effect: norms and residuals see this rank's rows only.
  bool splits_sequence() const { return active() && sequence_parallel; }
};

// The expert-model-parallel group a mixture-of-experts layer is built for (Megatron-Core's expert
// parallelism): the routed experts are split evenly over its ranks, and tokens travel to the rank
// holding their expert. Carved out of data parallelism (parallel/process_groups.h). Default: none.
struct ExpertParallel {
  parallel::Communicator* group = nullptr;  // null: a group of one

  int size() const { return group ? group->size() : 1; }
  int rank() const { return group ? group->rank() : 0; }
  bool active() const { return size() > 1; }
};

// The groups a model's parameters may be split over (ShardSpec::group), for gathering and counting
// them: tensor-parallel, and expert-parallel for the routed experts.
struct ShardGroups {
  TensorParallel tp;
  ExpertParallel ep;
  ShardGroups(const TensorParallel& t = {}, const ExpertParallel& e = {}) : tp(t), ep(e) {}  // NOLINT: implicit from tp
  // The communicator `spec` is split over (null: a group of one) and its size.
  parallel::Communicator* group_of(const ShardSpec& spec) const {
    return spec.group == ParallelGroup::Expert ? ep.group : tp.group;
  }
  int size_of(const ShardSpec& spec) const {
    parallel::Communicator* g = group_of(spec);
    return g ? g->size() : 1;
  }
};

// Each block of consecutive indices split evenly over `ranks`: rank r's pieces are its r-th part of
// every block, in block order (one block: Megatron's even split; [gate | up]: two). Throws naming
// `what` when a block does not divide.
std::vector<std::vector<ShardPiece>> even_pieces(const std::vector<int64_t>& blocks, int ranks, const std::string& what);
// The spec of a tensor split along `dim` into `pieces` over tp (ParallelGroup::Tensor).
ShardSpec split_spec(int dim, int64_t global_size, const TensorParallel& tp, std::vector<std::vector<ShardPiece>> pieces);
// The number of indices a rank's pieces hold: its local extent along the partition dim.
int64_t local_extent(const std::vector<ShardPiece>& pieces);

}  // namespace megaton::nn
