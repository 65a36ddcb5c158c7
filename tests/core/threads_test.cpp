#include "megaton/core/threads.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <thread>

namespace megaton {
namespace {

// How many threads one parallel region of the calling thread runs.
int team_size() {
  std::atomic<int> n{0};
#pragma omp parallel
  ++n;
  return n.load();
}

// serve loads on the main thread, releases its idle team and decodes on another thread: both must
// still get the configured team (the release frees threads; it must not shrink what later regions get).
TEST(Threads, ReleasingTheIdleTeamKeepsEveryThreadsTeamSize) {
  set_num_threads(2);
  ASSERT_EQ(team_size(), 2);
  release_idle_threads();
  int other = 0;
  std::thread([&] { other = team_size(); }).join();
  EXPECT_EQ(other, 2);
  EXPECT_EQ(team_size(), 2);
}

}  // namespace
}  // namespace megaton
