// RankLayout against Megatron-Core's group lists (its initialize_model_parallel docstring example
// and the same order at other sizes), and ProcessGroups over a group of one. No MPI.
#include "megaton/parallel/process_groups.h"

#include <gtest/gtest.h>

#include "megaton/parallel/local_communicator.h"

namespace megaton::parallel {
namespace {

using Groups = std::vector<std::vector<int>>;

std::string error_of(int world, ParallelSizes s) {
  try {
    RankLayout::make(world, s);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Megatron-Core's documented example: 16 GPUs, tensor parallel 2, pipeline parallel 4 -> data
// parallel 2, with these groups (g0 .. g15 are the global ranks).
TEST(RankLayout, MegatronDocumentedExample16GpusTp2Pp4) {
  const RankLayout l = RankLayout::make(16, {.tp = 2, .pp = 4});
  EXPECT_EQ(l.dp(), 2);
  EXPECT_EQ(l.all_groups(ParallelDim::Tp),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(l.all_groups(ParallelDim::Pp), (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(l.all_groups(ParallelDim::Dp),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(l.all_groups(ParallelDim::Cp).size(), 16u);  // cp 1: every rank alone
  // g9 is tp 1, dp 0, pp 2.
  EXPECT_EQ(l.coords(9), (RankCoords{.tp = 1, .cp = 0, .dp = 0, .pp = 2, .ep = 0}));
  EXPECT_EQ(l.group_ranks(9, ParallelDim::Pp), (std::vector<int>{1, 5, 9, 13}));
}

TEST(RankLayout, World8Tp2Pp2) {
  const RankLayout l = RankLayout::make(8, {.tp = 2, .pp = 2});
  EXPECT_EQ(l.dp(), 2);
  EXPECT_EQ(l.all_groups(ParallelDim::Tp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.all_groups(ParallelDim::Dp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.all_groups(ParallelDim::Pp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.coords(6), (RankCoords{.tp = 0, .cp = 0, .dp = 1, .pp = 1}));
  // A group's i-th rank has coordinate i along that dimension.
  for (int r = 0; r < 8; ++r) {
    const auto g = l.group_ranks(r, ParallelDim::Dp);
    for (int i = 0; i < 2; ++i) EXPECT_EQ(l.coords(g[i]).dp, i);
  }
}

// Context parallel sits between tp and dp (Megatron's tp-cp-dp-pp).
TEST(RankLayout, ContextParallelBetweenTensorAndData) {
  const RankLayout l = RankLayout::make(16, {.tp = 2, .cp = 2, .pp = 2});
  EXPECT_EQ(l.dp(), 2);
  EXPECT_EQ(l.all_groups(ParallelDim::Tp).front(), (std::vector<int>{0, 1}));
  EXPECT_EQ(l.all_groups(ParallelDim::Cp),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(l.all_groups(ParallelDim::Dp),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(l.all_groups(ParallelDim::Pp),
            (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
}

// The expert grid folds each stage's tp x cp x dp ranks (expert tensor parallel size 1): the ep
// groups are runs of consecutive ranks, across tensor-parallel ranks first.
TEST(RankLayout, ExpertGroupsFoldEachStagesRanks) {
  const RankLayout l = RankLayout::make(8, {.tp = 2, .ep = 2});
  EXPECT_EQ(l.dp(), 4);
  EXPECT_EQ(l.all_groups(ParallelDim::Ep), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.coords(6).ep, 0);
  EXPECT_EQ(l.coords(5).ep, 1);
  // The expert-data-parallel groups: the same ep coordinate, the rest of the stage.
  EXPECT_EQ(l.size(ParallelDim::Edp), 4);
  EXPECT_EQ(l.all_groups(ParallelDim::Edp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  // Without tensor parallelism, ep is the fast part of the data-parallel index; with pipeline
  // parallelism the grid repeats per stage.
  const RankLayout d = RankLayout::make(8, {.ep = 2, .pp = 2});
  EXPECT_EQ(d.all_groups(ParallelDim::Ep), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(d.all_groups(ParallelDim::Edp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  // ep larger than dp: the group spans tensor-parallel ranks of several data-parallel ranks.
  const RankLayout w = RankLayout::make(8, {.tp = 2, .ep = 4, .pp = 2});
  EXPECT_EQ(w.all_groups(ParallelDim::Ep), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(w.size(ParallelDim::Edp), 1);
  for (const RankLayout* lay : {&l, &d, &w}) {
    // Each rank's ep and edp groups meet in it alone and together span its stage.
    for (int r = 0; r < lay->world_size(); ++r) {
      const auto ep = lay->group_ranks(r, ParallelDim::Ep), edp = lay->group_ranks(r, ParallelDim::Edp);
      EXPECT_EQ(static_cast<int>(ep.size() * edp.size()), lay->stage_size());
      std::vector<int> both;
      for (int a : ep)
        for (int b : edp)
          if (a == b) both.push_back(a);
      EXPECT_EQ(both, std::vector<int>{r});
      for (int a : ep) EXPECT_EQ(lay->coords(a).pp, lay->coords(r).pp);
      EXPECT_EQ(ep[static_cast<size_t>(lay->coords(r).ep)], r);
    }
  }
}

TEST(RankLayout, CoordsAndRankRoundTrip) {
  const RankLayout l = RankLayout::make(24, {.tp = 2, .cp = 3, .pp = 2});
  EXPECT_EQ(l.dp(), 2);
  for (int r = 0; r < 24; ++r) EXPECT_EQ(l.rank_of(l.coords(r)), r);
  for (ParallelDim d : {ParallelDim::Tp, ParallelDim::Cp, ParallelDim::Dp, ParallelDim::Pp}) {
    // The groups of one dimension partition the world.
    std::vector<int> seen(24, 0);
    for (const auto& g : l.all_groups(d)) {
      EXPECT_EQ(static_cast<int>(g.size()), l.size(d));
      for (int r : g) ++seen[r];
    }
    for (int r = 0; r < 24; ++r) EXPECT_EQ(seen[r], 1) << parallel_dim_name(d) << " rank " << r;
  }
  EXPECT_THROW(l.coords(24), Error);
  EXPECT_THROW(l.rank_of({.tp = 2}), Error);
}

TEST(RankLayout, WorldThatDoesNotFactorNamesEverySize) {
  EXPECT_NE(error_of(6, {.tp = 4}).find("world size 6 is not divisible by tp 4 x cp 1 x pp 1"), std::string::npos)
      << error_of(6, {.tp = 4});
  EXPECT_NE(error_of(12, {.tp = 2, .cp = 2, .pp = 2}).find("world size 12 is not divisible by tp 2 x cp 2 x pp 2"),
            std::string::npos);
  const std::string ep = error_of(8, {.tp = 2, .ep = 3});
  EXPECT_NE(ep.find("tp x cp x dp = 8"), std::string::npos) << ep;
  EXPECT_NE(ep.find("expert-parallel size 3"), std::string::npos) << ep;
  EXPECT_NE(error_of(8, {.tp = 0}).find("tp 0"), std::string::npos);
  EXPECT_NE(error_of(0, {}).find("world size 0"), std::string::npos);
}

TEST(ProcessGroups, GroupOfOne) {
  LocalCommunicator world;
  ProcessGroups groups(world, {});
  EXPECT_EQ(&groups.world(), &world);
  EXPECT_EQ(groups.tp().name(), "tp");
  EXPECT_EQ(groups.cp().name(), "cp");
  EXPECT_EQ(groups.dp().name(), "dp");
  EXPECT_EQ(groups.pp().name(), "pp");
  EXPECT_EQ(groups.dp().size(), 1);
  EXPECT_EQ(groups.coords(), RankCoords{});
  EXPECT_EQ(&groups.group(ParallelDim::Ep), &groups.ep());
  EXPECT_EQ(groups.edp().name(), "edp");
  EXPECT_EQ(groups.edp().size(), 1);
  // Sizes that need more ranks than the world has.
  EXPECT_THROW(ProcessGroups(world, {.tp = 2}), Error);
}

}  // namespace
}  // namespace megaton::parallel
