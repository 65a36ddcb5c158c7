// plan calibrate's busy-send timings under mpirun (2 and 4 ranks; ranks past 1 only join the
// barriers and reductions): post-to-arrival of a send whose sender computes right after posting it.
#include <gtest/gtest.h>

#include <cmath>

#include "../support/mpi_test_main.h"
#include "megaton/parallel/mpi_communicator.h"
#include "megaton/plan/collective_bench.h"

namespace megaton::plan {
namespace {

parallel::Communicator& W() { return parallel::world(); }

TEST(BusySendSeconds, EveryArrivalComesAfterItsPostAndEveryRankHasTheSameTimings) {
  // The sender computes for 20 ms, far longer than a 1 MB message takes here: an arrival read
  // against a stamp taken after the computing would come out negative.
  const std::vector<double> s = busy_send_seconds(W(), 1 << 20, 0.02, 3);
  ASSERT_EQ(s.size(), 3u);
  for (double t : s) {
    EXPECT_TRUE(std::isfinite(t));
    EXPECT_GT(t, 0.0);
    EXPECT_LT(t, 1.0);
    EXPECT_EQ(W().all_reduce_scalar(t, parallel::ReduceOp::Max), t);
    EXPECT_EQ(W().all_reduce_scalar(t, parallel::ReduceOp::Min), t);
  }
}

}  // namespace
}  // namespace megaton::plan

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!megaton::testing::launched_or_explain(argv[0])) return 1;
  return megaton::testing::run_tests_on_every_rank(megaton::parallel::world());
}
