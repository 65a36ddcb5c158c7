// Rewind: an injected NaN or loss spike makes the trainer restore the last good state, skip the
// offending batch and go on; the run finishes within 2% of the clean run's final loss and the
// metrics list the skipped batches.
#include <gtest/gtest.h>

#include <cmath>

#include "tiny_run.h"

using namespace megaton::testing;

namespace {

const std::string kRewind = "--set rewind.enabled=true --set rewind.window=20 ";

void expect_close_to_clean(const Metrics& m, const Metrics& clean) {
  ASSERT_EQ(m.losses.size(), 60u);
  ASSERT_GT(clean.final_val_loss, 0);
  EXPECT_LT(std::abs(m.final_val_loss - clean.final_val_loss) / clean.final_val_loss, 0.02)
      << m.final_val_loss << " vs clean " << clean.final_val_loss;
}

}  // namespace

TEST(Rewind, NanAndSpikeAreRewoundAndSkipped) {
  TinyRunDir d;
  const Metrics c = d.train_ok("clean", kRewind);
  EXPECT_TRUE(c.events_of("rewind").empty()) << "false alarm: " << c.events_of("rewind")[0].dump();

  const Metrics n = d.train_ok("nan", kRewind + "--inject nan@step=40");
  ASSERT_EQ(n.events_of("rewind").size(), 1u);
  const auto r = n.events_of("rewind")[0];
  EXPECT_NE(r["reason"].get<std::string>().find("nan"), std::string::npos) << r.dump();
  EXPECT_EQ(r["restored_step"], 30);  // the in-memory snapshot every 10 steps
  EXPECT_EQ(r["restored_from"], "memory");
  EXPECT_EQ(r["skipped_batch"]["step"], 40);
  EXPECT_EQ(r["skipped_batches"], nlohmann::json::array({39 * 8}));
  for (int64_t step = 1; step < 40; ++step) EXPECT_EQ(n.losses.at(step), c.losses.at(step)) << step;
  EXPECT_EQ(n.steps.back()["consumed_samples"], 61 * 8);  // one batch more than steps
  expect_close_to_clean(n, c);

  // A spike, with the lr halved for 5 steps after the rewind.
  const Metrics s =
      d.train_ok("spike", kRewind + "--set rewind.lr_factor=0.5 --set rewind.lr_steps=5 --inject spike@step=55");
  ASSERT_EQ(s.events_of("rewind").size(), 1u);
  const auto sr = s.events_of("rewind")[0];
  EXPECT_NE(sr["reason"].get<std::string>().find("standard deviations above"), std::string::npos) << sr.dump();
  EXPECT_EQ(sr["restored_step"], 50);
  EXPECT_EQ(sr["skipped_batches"], nlohmann::json::array({54 * 8}));
  for (int64_t step = 55; step <= 60; ++step)
    EXPECT_EQ(s.last.at(step)["lr"].get<double>(), (step < 60 ? 0.5 : 1.0) * c.last.at(step)["lr"].get<double>())
        << step;
  expect_close_to_clean(s, c);
}

TEST(Rewind, FromTheLastCheckpointWhenNoSnapshotIsKept) {
  TinyRunDir d;
  const Metrics m = d.train_ok("disk", kRewind + "--set rewind.snapshot_interval=0 --inject nan@step=45");
  ASSERT_EQ(m.events_of("rewind").size(), 1u);
  EXPECT_EQ(m.events_of("rewind")[0]["restored_step"], 40);
  EXPECT_NE(m.events_of("rewind")[0]["restored_from"].get<std::string>().find("step_000040"), std::string::npos);
  EXPECT_EQ(m.losses.size(), 60u);
}

TEST(Rewind, MaxRewindsBoundsIt) {
  TinyRunDir d;
  auto run = d.train("bounded", kRewind + "--set rewind.max_rewinds=1 --inject nan@step=12 --inject nan@step=14");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.output.find("rewind.max_rewinds"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("step 14"), std::string::npos) << run.output;
}
