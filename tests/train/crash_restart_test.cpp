// Crash restart: with --max-restarts the training runs in a child process that is restarted from
// the newest valid checkpoint when it dies. Killed at a step and in the middle of a checkpoint
// write, the run still ends bitwise equal to the clean one, with no torn checkpoint left.
#include <gtest/gtest.h>

#include "tiny_run.h"

using namespace megaton::testing;

TEST(CrashRestart, KilledAtAStepAndDuringASaveEndsBitwiseEqualToTheCleanRun) {
  TinyRunDir d;
  const Metrics clean = d.train_ok("clean");
  auto crashed = d.train("crashed", "--max-restarts 3 --inject crash@save=20 --inject crash@step=37");
  ASSERT_EQ(crashed.exit_code, 0) << crashed.output;
  EXPECT_NE(crashed.output.find("restart 2 of 3"), std::string::npos) << crashed.output;
  const Metrics m = read_metrics(d.run_dir("crashed"));
  ASSERT_EQ(m.events_of("resume").size(), 2u);
  EXPECT_EQ(m.events_of("resume")[0]["step"], 10);  // step_000020 never completed
  // Killed at step 37, the process may take the asynchronous write of step 30 down with it.
  const auto second = m.events_of("resume")[1]["step"].get<int64_t>();
  EXPECT_TRUE(second == 30 || second == 20) << second;
  const auto torn = m.events_of("torn_checkpoint_removed");
  ASSERT_GE(torn.size(), 1u);
  EXPECT_NE(torn[0]["path"].get<std::string>().find("step_000020.tmp"), std::string::npos) << torn[0].dump();
  EXPECT_TRUE(torn_checkpoints(d.run_dir("crashed")).empty());
  EXPECT_EQ(m.losses, clean.losses);
  expect_bitwise_equal(final_weights(d.run_dir("clean")), final_weights(d.run_dir("crashed")));
}

TEST(CrashRestart, WithoutRestartsACrashEndsTheRunAndTooManyCrashesGiveUp) {
  TinyRunDir d;
  auto once = d.train("once", "--inject crash@step=5");
  EXPECT_NE(once.exit_code, 0);
  // Saved synchronously: on a loaded machine an asynchronous step-10 write can still be running
  // when step 15 crashes, and the refusal below needs a checkpoint on disk.
  auto repeated = d.train("repeated", "--max-restarts 1 --inject crash@step=15 --inject crash@step=17 "
                                      "--set checkpoint.async_save=false");
  EXPECT_NE(repeated.exit_code, 0);
  EXPECT_NE(repeated.output.find("giving up after 1 restarts"), std::string::npos) << repeated.output;
  // A failure while setting up would only repeat: not restarted (here: a fresh start refused
  // next to the checkpoints of the run above).
  auto setup = d.train("repeated", "--max-restarts 3");
  EXPECT_NE(setup.exit_code, 0);
  EXPECT_NE(setup.output.find("already holds a run"), std::string::npos) << setup.output;
  EXPECT_NE(setup.output.find("not restarting"), std::string::npos) << setup.output;
  EXPECT_EQ(setup.output.find("restart 1 of 3"), std::string::npos) << setup.output;
}
