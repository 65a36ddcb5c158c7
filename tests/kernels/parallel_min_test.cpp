// cpu/parallel_min.h's parallel_for: every index once, on the calling thread alone below
// kParallelMin elements of work (no OpenMP region: decode's per-token kernels) and over the threads
// from there on.
#include "megaton/kernels/cpu/parallel_min.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <set>
#include <vector>

using namespace megaton::kernels::cpu;

namespace {

struct Calls {
  std::vector<int> count;
  std::set<int> threads;
  bool in_region = false;
};

Calls run(int64_t n, int64_t work) {
  Calls c;
  c.count.assign(static_cast<size_t>(n), 0);
  std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
  std::vector<int> thread_of(static_cast<size_t>(n), -1);
  std::atomic<bool> in_region{false};
  parallel_for(n, work, [&](int64_t i) {
    seen[static_cast<size_t>(i)].fetch_add(1);
    thread_of[static_cast<size_t>(i)] = omp_get_thread_num();
    if (omp_in_parallel()) in_region = true;
  });
  for (int64_t i = 0; i < n; ++i) {
    c.count[static_cast<size_t>(i)] = seen[static_cast<size_t>(i)].load();
    c.threads.insert(thread_of[static_cast<size_t>(i)]);
  }
  c.in_region = in_region;
  return c;
}

}  // namespace

// Planted: the parallel branch's loop stopping one index short, caught (a count of 0).
TEST(ParallelFor, EveryIndexOnceOnEitherSideOfTheThreshold) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}}) {
    const Calls below = run(n, kParallelMin - 1), above = run(n, kParallelMin);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(below.count[static_cast<size_t>(i)], 1) << n << " below, index " << i;
      EXPECT_EQ(above.count[static_cast<size_t>(i)], 1) << n << " above, index " << i;
    }
    EXPECT_FALSE(below.in_region) << n;
    if (n > 0) {
      EXPECT_EQ(below.threads, std::set<int>{0}) << n;
    }
    if (n >= 2) {
      EXPECT_TRUE(above.in_region) << n;
      EXPECT_EQ(above.threads.size(), 2u) << n;
    }
  }
  omp_set_num_threads(saved);
}
