// The asynchronous writer: submit() returns while the job runs, at most one job is in flight,
// failures are retried, and a job that fails every attempt is raised, not dropped.
#include "megaton/ckpt/async_writer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>

#include "../support/temp_dir.h"

using namespace megaton;

TEST(AsyncWriter, RunsInTheBackgroundOneJobAtATime) {
  ckpt::AsyncWriter writer(true, 1);
  std::atomic<int> running{0}, most{0}, done{0};
  auto job = [&] {
    most = std::max(most.load(), ++running);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    --running;
    ++done;
  };
  const auto t0 = std::chrono::steady_clock::now();
  writer.submit("first", job);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(80));  // did not wait for it
  writer.submit("second", job);  // waits for the first
  writer.wait();
  EXPECT_EQ(done, 2);
  EXPECT_EQ(most, 1);
  auto reports = writer.take_finished();
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].what, "first");
  EXPECT_GE(reports[0].end_time - reports[0].start_time, 0.09);
  EXPECT_LE(reports[0].end_time, reports[1].start_time);
  EXPECT_TRUE(writer.take_finished().empty());
}

TEST(AsyncWriter, RetriesAndRaisesAPersistentFailure) {
  for (bool async : {true, false}) {
    ckpt::AsyncWriter writer(async, 3);
    int calls = 0;
    writer.submit("flaky", [&] {
      if (++calls < 3) fail("transient error");
    });
    writer.wait();
    EXPECT_EQ(calls, 3);
    auto reports = writer.take_finished();
    ASSERT_EQ(reports.size(), 1u);
    EXPECT_EQ(reports[0].attempts, 3);

    auto broken = [] { fail("disk on fire"); };
    if (async) {
      writer.submit("broken", broken);
      EXPECT_ERROR_CONTAINS(writer.wait(), "writing broken failed after 3 attempts: disk on fire");
    } else {
      EXPECT_ERROR_CONTAINS(writer.submit("broken", broken), "writing broken failed after 3 attempts");
    }
    EXPECT_TRUE(writer.take_finished().empty());
  }
}
