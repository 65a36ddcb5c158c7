#include "megaton/data/data_loader.h"

#include <gtest/gtest.h>

#include <numeric>

#include "../support/counting_source.h"
#include "../support/temp_dir.h"

using namespace megaton;
using namespace megaton::data;
using megaton::testing::CountingSource;

namespace {

DataLoaderOptions options(int64_t B, int64_t rank, int64_t dp, int64_t consumed, int workers = 3) {
  DataLoaderOptions o;
  o.micro_batch_size = B;
  o.data_parallel_rank = rank;
  o.data_parallel_size = dp;
  o.consumed_samples = consumed;
  o.num_workers = workers;
  o.prefetch = 4;
  return o;
}

// All micro-batches a loader yields, as (sample ids, inputs, targets).
std::vector<Batch> drain(DataLoader& loader, int64_t limit = -1) {
  std::vector<Batch> out;
  Batch b;
  while (limit-- != 0 && loader.next(b)) out.push_back(b);
  return out;
}

}  // namespace

TEST(DataLoader, InputsAndTargetsAreTheSampleShiftedByOne) {
  auto src = std::make_shared<CountingSource>(10, 5);
  DataLoader loader(src, options(2, 0, 1, 0));
  auto batches = drain(loader);
  ASSERT_EQ(batches.size(), 5u);
  const Batch& b = batches[1];
  EXPECT_EQ(b.sample_ids, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b.inputs, (std::vector<int32_t>{2000, 2001, 2002, 2003, 2004, 3000, 3001, 3002, 3003, 3004}));
  EXPECT_EQ(b.targets, (std::vector<int32_t>{2001, 2002, 2003, 2004, 2005, 3001, 3002, 3003, 3004, 3005}));
  EXPECT_EQ(loader.consumed_samples(), 10);
}

TEST(DataLoader, ResumingAtAConsumedCountContinuesTheSameStream) {
  auto src = std::make_shared<CountingSource>(1000, 3);
  for (int64_t dp : {1, 4}) {
    for (int64_t rank = 0; rank < dp; ++rank) {
      DataLoader whole(src, options(3, rank, dp, 0));
      const auto all = drain(whole);
      ASSERT_EQ(static_cast<int64_t>(all.size()), 1000 / (3 * dp));
      for (int64_t k : {1, 7, 40}) {
        DataLoader first(src, options(3, rank, dp, 0));
        auto got = drain(first, k);
        DataLoader resumed(src, options(3, rank, dp, first.consumed_samples(), 2));
        for (auto& b : drain(resumed)) got.push_back(std::move(b));
        ASSERT_EQ(got.size(), all.size());
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_EQ(got[i].sample_ids, all[i].sample_ids) << "dp " << dp << " rank " << rank << " k " << k;
          ASSERT_EQ(got[i].inputs, all[i].inputs);
          ASSERT_EQ(got[i].targets, all[i].targets);
        }
      }
    }
  }
}

TEST(DataLoader, DataParallelRanksSplitEveryGlobalMicroStep) {
  const int64_t B = 4, dp = 3, T = 2;
  auto src = std::make_shared<CountingSource>(200, T);
  std::vector<std::vector<Batch>> per_rank;
  for (int64_t r = 0; r < dp; ++r) {
    DataLoader loader(src, options(B, r, dp, 24));
    per_rank.push_back(drain(loader));
  }
  const size_t steps = (200 - 24) / (B * dp);
  for (size_t k = 0; k < steps; ++k) {
    // Ranks in order, each its contiguous slice: together the global micro-step, nothing twice.
    std::vector<int64_t> joined;
    for (int64_t r = 0; r < dp; ++r) {
      ASSERT_EQ(per_rank[static_cast<size_t>(r)].size(), steps);
      const Batch& batch = per_rank[static_cast<size_t>(r)][k];
      joined.insert(joined.end(), batch.sample_ids.begin(), batch.sample_ids.end());
      // The rows are the samples the ids name (CountingSource's sample i starts with i * 1000).
      for (int64_t b = 0; b < B; ++b)
        ASSERT_EQ(batch.inputs[static_cast<size_t>(b * T)], batch.sample_ids[static_cast<size_t>(b)] * 1000);
    }
    std::vector<int64_t> want(static_cast<size_t>(B * dp));
    std::iota(want.begin(), want.end(), 24 + static_cast<int64_t>(k) * B * dp);
    ASSERT_EQ(joined, want) << "micro-step " << k;
  }
}

TEST(DataLoader, ReadErrorsSurfaceInOrderAndBadOptionsAreNamed) {
  auto src = std::make_shared<CountingSource>(100, 2, std::set<int64_t>{21});
  DataLoader loader(src, options(2, 0, 1, 0));
  Batch b;
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(loader.next(b));
  EXPECT_ERROR_CONTAINS(loader.next(b), "sample 21 is unreadable");
  EXPECT_EQ(loader.consumed_samples(), 20);

  EXPECT_ERROR_CONTAINS(DataLoader(src, options(0, 0, 1, 0)), "micro_batch_size");
  EXPECT_ERROR_CONTAINS(DataLoader(src, options(2, 2, 2, 0)), "rank 2", "[0, 2)");
  EXPECT_ERROR_CONTAINS(DataLoader(src, options(2, 0, 1, 101)), "consumed_samples 101");
  DataLoader at_end(src, options(2, 0, 1, 99));
  EXPECT_FALSE(at_end.next(b));
}
