#include "megaton/parallel/process_groups.h"

#include "megaton/parallel/local_communicator.h"

namespace megaton::parallel {

std::string_view parallel_dim_name(ParallelDim d) {
  switch (d) {
    case ParallelDim::Tp: return "tp";
    case ParallelDim::Cp: return "cp";
    case ParallelDim::Dp: return "dp";
    case ParallelDim::Pp: return "pp";
    case ParallelDim::Ep: return "ep";
    case ParallelDim::Edp: return "edp";
  }
  return "?";
}

RankLayout RankLayout::make(int world_size, const ParallelSizes& s) {
  auto sizes = [&] {
    return detail::concat("tp ", s.tp, " x cp ", s.cp, " x pp ", s.pp);
  };
  if (world_size < 1) fail("world size ", world_size, " is not positive");
  if (s.tp < 1 || s.cp < 1 || s.pp < 1 || s.ep < 1)
    fail("parallel sizes must be at least 1: tp ", s.tp, ", cp ", s.cp, ", ep ", s.ep, ", pp ", s.pp);
  const int64_t model = int64_t{s.tp} * s.cp * s.pp;
  if (world_size % model != 0) fail("world size ", world_size, " is not divisible by ", sizes(), " (= ", model, ")");
  RankLayout l;
  l.world_ = world_size;
  l.tp_ = s.tp;
  l.cp_ = s.cp;
  l.pp_ = s.pp;
  l.ep_ = s.ep;
  l.dp_ = static_cast<int>(world_size / model);
  if (l.stage_size() % s.ep != 0)
    fail("world size ", world_size, " with ", sizes(), " leaves data-parallel size ", l.dp_, ": tp x cp x dp = ",
         l.stage_size(), " ranks per pipeline stage, which expert-parallel size ", s.ep, " does not divide");
  return l;
}

int RankLayout::size(ParallelDim d) const {
  switch (d) {
    case ParallelDim::Tp: return tp_;
    case ParallelDim::Cp: return cp_;
    case ParallelDim::Dp: return dp_;
    case ParallelDim::Pp: return pp_;
    case ParallelDim::Ep: return ep_;
    case ParallelDim::Edp: return stage_size() / ep_;
  }
  return 1;
}

void RankLayout::check_rank(int rank) const {
  if (rank < 0 || rank >= world_) fail("rank ", rank, " is outside a world of ", world_);
}

RankCoords RankLayout::coords(int rank) const {
  check_rank(rank);
  RankCoords c;
  int r = rank;
  c.tp = r % tp_;
  r /= tp_;
  c.cp = r % cp_;
  r /= cp_;
  c.dp = r % dp_;
  r /= dp_;
  c.pp = r;
  c.ep = rank % stage_size() % ep_;
  return c;
}

int RankLayout::rank_of(const RankCoords& c) const {
  if (c.tp < 0 || c.tp >= tp_ || c.cp < 0 || c.cp >= cp_ || c.dp < 0 || c.dp >= dp_ || c.pp < 0 || c.pp >= pp_)
    fail("coordinates tp ", c.tp, ", cp ", c.cp, ", dp ", c.dp, ", pp ", c.pp, " are outside the layout tp ", tp_,
         " x cp ", cp_, " x dp ", dp_, " x pp ", pp_);
  return c.tp + tp_ * (c.cp + cp_ * (c.dp + dp_ * c.pp));
}

std::vector<int> RankLayout::group_ranks(int rank, ParallelDim dim) const {
  RankCoords c = coords(rank);
  std::vector<int> ranks;
  const int n = size(dim);
  if (dim == ParallelDim::Ep || dim == ParallelDim::Edp) {  // over the stage's ranks, ep fastest
    const int stage = c.pp * stage_size(), in_stage = rank - stage;
    for (int i = 0; i < n; ++i)
      ranks.push_back(stage + (dim == ParallelDim::Ep ? in_stage - c.ep + i : c.ep + ep_ * i));
    return ranks;
  }
  for (int i = 0; i < n; ++i) {
    RankCoords g = c;
    switch (dim) {
      case ParallelDim::Tp: g.tp = i; break;
      case ParallelDim::Cp: g.cp = i; break;
      case ParallelDim::Dp: g.dp = i; break;
      case ParallelDim::Pp: g.pp = i; break;
      case ParallelDim::Ep:
      case ParallelDim::Edp: break;  // above
    }
    ranks.push_back(rank_of(g));
  }
  return ranks;
}

std::vector<std::vector<int>> RankLayout::all_groups(ParallelDim dim) const {
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < world_; ++r) {
    auto g = group_ranks(r, dim);
    if (g.front() == r) groups.push_back(std::move(g));  // each group once, at its lowest rank
  }
  return groups;
}

ProcessGroups::ProcessGroups(Communicator& world, const ParallelSizes& sizes)
    : world_(world), layout_(RankLayout::make(world.size(), sizes)), coords_(layout_.coords(world.rank())) {
  auto make = [&](ParallelDim d) -> std::unique_ptr<Communicator> {
    const std::string name(parallel_dim_name(d));
    if (layout_.size(d) == 1) return std::make_unique<LocalCommunicator>(name);
    // Color: the group's lowest rank (unique per group); key: the position in the group, so the
    // new group's rank is this rank's coordinate along d.
    const std::vector<int> ranks = layout_.group_ranks(world.rank(), d);
    int pos = 0;
    while (ranks[pos] != world.rank()) ++pos;
    auto comm = world.split(ranks.front(), pos, name);
    if (comm->size() != layout_.size(d) || comm->rank() != pos)
      fail("split of group '", name, "': got rank ", comm->rank(), " of ", comm->size(), ", expected ", pos, " of ",
           layout_.size(d));
    return comm;
  };
  tp_ = make(ParallelDim::Tp);
  cp_ = make(ParallelDim::Cp);
  dp_ = make(ParallelDim::Dp);
  pp_ = make(ParallelDim::Pp);
  ep_ = make(ParallelDim::Ep);
  edp_ = make(ParallelDim::Edp);
}

ProcessGroups::~ProcessGroups() = default;

Communicator& ProcessGroups::group(ParallelDim d) const {
  switch (d) {
    case ParallelDim::Tp: return *tp_;
    case ParallelDim::Cp: return *cp_;
    case ParallelDim::Dp: return *dp_;
    case ParallelDim::Pp: return *pp_;
    case ParallelDim::Ep: return *ep_;
    case ParallelDim::Edp: return *edp_;
  }
  fail("unknown parallel dimension ", static_cast<int>(d));
}

}  // namespace megaton::parallel
