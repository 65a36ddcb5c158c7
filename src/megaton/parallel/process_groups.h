// Which ranks form which parallel group, and the groups themselves.
//
// RankLayout is the pure arithmetic (testable without MPI): the world is a grid of
// tp x cp x dp x pp ranks laid out in Megatron-Core's order tp-cp-dp-pp, tensor parallel fastest
// and pipeline parallel slowest:
//   rank = tp + TP * (cp + CP * (dp + DP * pp))
// so a tensor-parallel group is a run of consecutive ranks and a pipeline stage is a contiguous
// block of world / PP ranks. The MoE layers see each stage's tp x cp x dp ranks again as
// Megatron-Core's expert grid "etp-ep-edp-pp" with expert tensor parallel size 1 (DeepSeek-V3's
// layout: experts whole on a rank, tensor-parallel ranks splitting the tokens instead): a rank's
// index inside its stage, s = tp + TP * (cp + CP * dp), is ep + EP * edp, EP dividing TP x CP x DP.
// The expert-parallel group (Ep) is a run of EP consecutive ranks; the expert-data-parallel group
// (Edp) is the ranks holding the same experts, whose expert gradients are summed (size
// TP x CP x DP / EP). Without tensor and context parallelism this is ep carved out of dp.
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

enum class ParallelDim { Tp, Cp, Dp, Pp, Ep, Edp };
std::string_view parallel_dim_name(ParallelDim d);  // "tp", "cp", "dp", "pp", "ep", "edp"

// A rank's position along each dimension. ep = s % EP (its place inside its expert group, s its
// index inside its stage).
struct RankCoords {
  int tp = 0, cp = 0, dp = 0, pp = 0, ep = 0;
  bool operator==(const RankCoords&) const = default;
};

class RankLayout {
 public:
  // dp = world_size / (tp * cp * pp). Throws naming the world size and every size when the world
  // does not factor, a size is below 1, or ep does not divide tp x cp x dp.
  static RankLayout make(int world_size, const ParallelSizes& sizes);

  int world_size() const { return world_; }
  int tp() const { return tp_; }
  int cp() const { return cp_; }
  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int ep() const { return ep_; }
  // Ranks per pipeline stage: tp x cp x dp.
  int stage_size() const { return tp_ * cp_ * dp_; }
  int size(ParallelDim d) const;

  RankCoords coords(int rank) const;
  // The ep coordinate is ignored (it is dp % ep).
  int rank_of(const RankCoords& c) const;
  // The ranks of `rank`'s group along `dim`, in group order (position i has coordinate i along
  // `dim`). The ep group: the stage's ranks s with the same s / EP; the edp group: those with the
  // same ep (position i: s = ep + EP * i).
  std::vector<int> group_ranks(int rank, ParallelDim dim) const;
  // Every group along `dim`, ordered by lowest rank (Megatron's enumeration order).
  std::vector<std::vector<int>> all_groups(ParallelDim dim) const;

 private:
  void check_rank(int rank) const;
  int world_ = 1, tp_ = 1, cp_ = 1, dp_ = 1, pp_ = 1, ep_ = 1;
};

// The tp, cp, dp, pp, ep and edp groups of this rank, split once from the world (collective: every rank of
// the world constructs its ProcessGroups with the same sizes, in the same order of other group
// operations). A dimension of size 1 is a LocalCommunicator (no MPI communicator made). Groups are
// named by parallel_dim_name; a group's rank is this rank's coordinate along it (ep: its ep coordinate,
// edp: s / EP).
class ProcessGroups {
 public:
  ProcessGroups(Communicator& world, const ParallelSizes& sizes);
  ~ProcessGroups();

  Communicator& world() const { return world_; }
  Communicator& tp() const { return *tp_; }
  Communicator& cp() const { return *cp_; }
  Communicator& dp() const { return *dp_; }
  Communicator& pp() const { return *pp_; }
  Communicator& ep() const { return *ep_; }
  Communicator& edp() const { return *edp_; }
  Communicator& group(ParallelDim d) const;
  const RankLayout& layout() const { return layout_; }
  const RankCoords& coords() const { return coords_; }

 private:
  Communicator& world_;
  RankLayout layout_;
  RankCoords coords_;
  std::unique_ptr<Communicator> tp_, cp_, dp_, pp_, ep_, edp_;
};

}  // namespace megaton::parallel
