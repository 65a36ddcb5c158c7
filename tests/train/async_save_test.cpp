// Asynchronous checkpoint writes: training steps go on while the writer thread works (seen in the
// metrics timestamps), the files equal those of a synchronous save of the same step, and a failed
// write is retried, or raised when every attempt fails, never dropped.
#include <gtest/gtest.h>

#include "tiny_run.h"

using namespace megaton::testing;

namespace {

// Steps whose end falls inside a checkpoint write of the same run.
int steps_during_writes(const Metrics& m) {
  int n = 0;
  for (const auto& save : m.events_of("checkpoint"))
    for (const auto& s : m.steps)
      n += s["time"].get<double>() > save["write_start"].get<double>() &&
           s["time"].get<double>() < save["write_end"].get<double>();
  return n;
}

}  // namespace

TEST(AsyncSave, StepsOverlapTheWriteAndTheFilesEqualASynchronousSave) {
  TinyRunDir d;
  // A slow file system (0.3 s per write) makes the overlap, or its absence, unmistakable.
  const Metrics a = d.train_ok("async", "--inject slow@save=0.3");
  const Metrics s = d.train_ok("sync", "--inject slow@save=0.3 --set checkpoint.async_save=false");
  ASSERT_EQ(a.events_of("checkpoint").size(), 6u);
  ASSERT_EQ(s.events_of("checkpoint").size(), 6u);
  EXPECT_GT(steps_during_writes(a), 5);
  EXPECT_EQ(steps_during_writes(s), 0);
  for (const auto& save : s.events_of("checkpoint")) EXPECT_GE(save["stall_s"].get<double>(), 0.3);
  // The first async save never waits for an earlier one: it pays for the snapshot copy only.
  EXPECT_LT(a.events_of("checkpoint")[0]["stall_s"].get<double>(), 0.1);
  EXPECT_EQ(a.losses, s.losses);

  for (const std::string step : {"step_000050", "step_000060"}) {
    const std::string from_async = d.run_dir("async") + "/checkpoints/" + step + "/";
    const std::string from_sync = d.run_dir("sync") + "/checkpoints/" + step + "/";
    for (const char* f : {"config.json", "shard_00000.safetensors", "metadata.json"})
      EXPECT_EQ(read_bytes(from_async + f), read_bytes(from_sync + f)) << step << "/" << f;
    auto state_a = nlohmann::json::parse(read_bytes(from_async + "state.json"));
    auto state_s = nlohmann::json::parse(read_bytes(from_sync + "state.json"));
    state_a.erase("config");  // differs in checkpoint.async_save only
    state_s.erase("config");
    EXPECT_EQ(state_a, state_s) << step;
  }
}

TEST(AsyncSave, AFailedWriteIsRetriedAndOneThatKeepsFailingStopsTraining) {
  TinyRunDir d;
  auto retried = d.train("retried", "--inject fail@save=20");
  ASSERT_EQ(retried.exit_code, 0) << retried.output;
  EXPECT_NE(retried.output.find("writing step_000020 failed (attempt 1 of 3)"), std::string::npos) << retried.output;
  bool found = false;
  for (const auto& save : read_metrics(d.run_dir("retried")).events_of("checkpoint"))
    if (save["step"] == 20) {
      found = true;
      EXPECT_EQ(save["attempts"], 2);
    }
  EXPECT_TRUE(found);

  auto failed = d.train("failed", "--inject fail@save=20 --set checkpoint.write_attempts=1");
  EXPECT_NE(failed.exit_code, 0);
  EXPECT_NE(failed.output.find("error: writing step_000020 failed after 1 attempts"), std::string::npos)
      << failed.output;
}
