// The main of a multi-process gtest binary (tests/<layer>/*_mpi_test.cpp, run under mpirun): every
// rank runs every test; ranks other than 0 print their failures with their rank instead of gtest's
// report, and the job's verdict is every rank's (any rank's failure fails all).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "megaton/parallel/communicator.h"

namespace megaton::testing {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }

 private:
  int rank_;
};

// RUN_ALL_TESTS on every rank of w (gtest already initialised); the exit code of the job.
inline int run_tests_on_every_rank(parallel::Communicator& w) {
  if (w.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(w.rank()));
  }
  const int rc = RUN_ALL_TESTS();
  const double failed = w.all_reduce_scalar(rc != 0 ? 1.0 : 0.0, parallel::ReduceOp::Max);
  if (w.rank() == 0 && failed > 0 && rc == 0) std::fprintf(stderr, "another rank failed (see its [rank R] lines)\n");
  return failed > 0 ? 1 : 0;
}

// Whether this binary runs under an MPI launcher; says how to run it when not.
inline bool launched_or_explain(const char* argv0) {
  if (parallel::launched_distributed()) return true;
  std::fprintf(stderr, "%s: run under mpirun with 2 or more ranks (CTest does)\n", argv0);
  return false;
}

// max |got - want| / max |want| <= 1e-5 over f32 tensors (NaN / inf fail), naming this rank of the
// world: the multi-process tests' comparison against a single-process reference.
inline void expect_close_on_rank(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.data<float>()[i], w = want.data<float>()[i];
    ASSERT_TRUE(std::isfinite(g) && std::isfinite(w)) << what << " element " << i << ": " << g << " vs " << w;
    diff = std::max(diff, std::abs(g - w));
    ref = std::max(ref, std::abs(w));
  }
  EXPECT_LE(diff, 1e-5 * std::max(ref, 1e-30))
      << what << " (rank " << parallel::world().rank() << " of " << parallel::world().size() << ")";
}

}  // namespace megaton::testing
