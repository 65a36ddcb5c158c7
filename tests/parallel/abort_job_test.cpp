// A failing rank brings the whole job down, never a hang: `megaton` under mpirun with a config
// error on every rank, and a rank that aborts while the others wait in an all-reduce it never joins
// (communicator_mpi_test's planted-failure mode). Single-process errors are unchanged.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>

#include "../support/mpirun.h"
#include "../support/run_command.h"
#include "../support/temp_dir.h"

namespace {

using megaton::testing::mpirun;
using megaton::testing::run_command;

// A config the trainer refuses before touching data or the run directory.
std::string bad_train_args(const megaton::testing::TempDir& dir) {
  const std::string config = dir.file("empty.toml");
  std::ofstream(config) << "# nothing: the --set below is the error\n";
  return " train --config " + config + " --set model.num_layers=-1";
}

TEST(AbortJob, SingleProcessErrorIsUnchanged) {
  megaton::testing::TempDir dir;
  const auto r = run_command(std::string(MEGATON_BINARY) + bad_train_args(dir));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("num_layers"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("[rank "), std::string::npos) << r.output;
}

TEST(AbortJob, ErrorOnEveryRankEndsTheJob) {
  megaton::testing::TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = run_command(mpirun(2) + MEGATON_BINARY + bad_train_args(dir));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("num_layers"), std::string::npos) << r.output;
  EXPECT_LT(seconds, 50) << r.output;
}

#ifdef MEGATON_MPI_TEST_BINARY
TEST(AbortJob, FailingRankEndsRanksBlockedInACollective) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = run_command("MEGATON_TEST_ABORT_RANK=1 " + mpirun(2) + MEGATON_MPI_TEST_BINARY);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 1] error: planted failure"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("rank 0 finished"), std::string::npos) << r.output;
  EXPECT_LT(seconds, 50) << r.output;
}
#endif

}  // namespace
