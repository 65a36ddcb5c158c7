// Which ranks form which parallel group, and the groups themselves.
//
// RankLayout is the pure arithmetic (testable without MPI): the world is a grid of
// tp x cp x dp x pp ranks laid out in Megatron-Core's order tp-cp-dp-pp, tensor parallel fastest
// and pipeline parallel slowest:
//   rank = tp + TP * (cp + CP * (dp + DP * pp))
// so a tensor-parallel group is a run of consecutive ranks and a pipeline stage is a contiguous
// block of world / PP ranks. Expert parallelism is carved out of data parallelism as in
// Megatron-Core's "tp-cp-ep-dp-pp" order: the dp index is ep + EP * (dp / EP), EP dividing DP.
// ProcessGroups splits a world Communicator into those groups once.
#pragma once
#include <memory>
#include <string_view>
#include <vector>

#include "megaton/parallel/communicator.h"

namespace megaton::parallel {

struct ParallelSizes {
  int tp = 1, cp = 1, ep = 1, pp = 1;
};

enum class ParallelDim { Tp, Cp, Dp, Pp, Ep };
std::string_view parallel_dim_name(ParallelDim d);  // "tp", "cp", "dp", "pp", "ep"

// A rank's position along each dimension. ep = dp % EP (its place inside its expert group).
struct RankCoords {
  int tp = 0, cp = 0, dp = 0, pp = 0, ep = 0;
  bool operator==(const RankCoords&) const = default;
};

class RankLayout {
 public:
  // dp = world_size / (tp * cp * pp). Throws naming the world size and every size when the world
  // does not factor, a size is below 1, or ep does not divide dp.
  static RankLayout make(int world_size, const ParallelSizes& sizes);

  int world_size() const { return world_; }
  int tp() const { return tp_; }
  int cp() const { return cp_; }
  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int ep() const { return ep_; }
  int size(ParallelDim d) const;

  RankCoords coords(int rank) const;
  // The ep coordinate is ignored (it is dp % ep).
  int rank_of(const RankCoords& c) const;
  // The ranks of `rank`'s group along `dim`, in group order (position i has coordinate i along
  // `dim`). The ep group: the ranks that share tp, cp, pp and dp / ep.
  std::vector<int> group_ranks(int rank, ParallelDim dim) const;
  // Every group along `dim`, ordered by lowest rank (Megatron's enumeration order).
  std::vector<std::vector<int>> all_groups(ParallelDim dim) const;

 private:
  void check_rank(int rank) const;
  int world_ = 1, tp_ = 1, cp_ = 1, dp_ = 1, pp_ = 1, ep_ = 1;
};

// The tp, cp, dp and pp groups of this rank, split once from the world (collective: every rank of
// the world constructs its ProcessGroups with the same sizes, in the same order of other group
// operations). A dimension of size 1 is a LocalCommunicator (no MPI communicator made). Groups are
// named "tp", "cp", "dp", "pp"; a group's rank is this rank's coordinate along it.
class ProcessGroups {
 public:
  ProcessGroups(Communicator& world, const ParallelSizes& sizes);
  ~ProcessGroups();

  Communicator& world() const { return world_; }
  Communicator& tp() const { return *tp_; }
  Communicator& cp() const { return *cp_; }
  Communicator& dp() const { return *dp_; }
  Communicator& pp() const { return *pp_; }
  Communicator& group(ParallelDim d) const;  // Ep is not built yet: an error
  const RankLayout& layout() const { return layout_; }
  const RankCoords& coords() const { return coords_; }

 private:
  Communicator& world_;
  RankLayout layout_;
  RankCoords coords_;
  std::unique_ptr<Communicator> tp_, cp_, dp_, pp_;
};

}  // namespace megaton::parallel
