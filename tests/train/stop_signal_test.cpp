// Signals (issue 8, principle 5): SIGTERM or SIGINT finishes the current step, writes a checkpoint
// and exits with status 3, and the run resumed from it ends bitwise equal to the uninterrupted one;
// a second signal ends the process at once without a torn checkpoint; a supervised run
// (--max-restarts) that finished or was stopped is not restarted. (Data-parallel stops:
// dp_resilience_test.)
#include <gtest/gtest.h>

#include "megaton/ckpt/checkpoint_dir.h"
#include "megaton/ckpt/manifest.h"
#include "tiny_run.h"

using namespace megaton;
using namespace megaton::testing;
namespace fs = std::filesystem;

namespace {

// A run long enough to be signalled while it trains (the lr schedule does not depend on its length).
const std::string kLong = "--set training.train_iters=100000 --set optimizer.lr_decay_iters=60 "
                          "--set logging.save_interval=0 ";

}  // namespace

// An injected SIGTERM at step 4 (deterministic), and a real SIGINT from outside: each stops after a
// whole step with a checkpoint of it and status 3; resumed, the first ends bitwise like the clean run.
TEST(StopSignal, ASignalStopsAfterTheStepWithACheckpointThatResumesBitwise) {
  TinyRunDir d;
  const std::string args = "--set training.train_iters=8 --set logging.save_interval=0 ";
  const Metrics clean = d.train_ok("clean", args);
  CommandResult r = d.train("stopped", args + "--inject sigterm@step=4");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  const std::string run = d.run_dir("stopped");
  EXPECT_NE(r.output.find("stopped by a signal (SIGTERM) after step 4; the newest checkpoint is " + run +
                          "/checkpoints/step_000004; continue with --resume auto"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(read_metrics(run).losses.size(), 4u);
  EXPECT_FALSE(fs::exists(run + "/final"));
  r = d.train("stopped", args + "--resume auto");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_metrics(run).losses, clean.losses);
  expect_bitwise_equal(final_weights(d.run_dir("clean")), final_weights(run));

  const std::string outside = d.run_dir("outside");
  r = run_and_signal(d.command("outside", kLong), outside + "/metrics.jsonl", {"INT"}, d.run_dir("outside.log"));
  EXPECT_NE(r.output.find("exit=3"), std::string::npos) << r.output;
  const Metrics m = read_metrics(outside);
  ASSERT_EQ(m.events_of("stopped").size(), 1u) << r.output;
  const auto step = m.events_of("stopped")[0]["step"].get<int64_t>();
  EXPECT_EQ(m.events_of("stopped")[0]["reason"], "SIGINT");
  EXPECT_EQ(m.steps.size(), static_cast<size_t>(step));
  EXPECT_NO_THROW(ckpt::verify_manifest(outside + "/checkpoints/" + ckpt::checkpoint_name(step)));
}

// The second signal arrives while the stop's checkpoint is being written (slowly): the process ends
// at once, killed by it, leaving no checkpoint under a real name that fails verification; the run
// resumes from what is there.
TEST(StopSignal, ASecondSignalStopsAtOnceWithoutATornCheckpoint) {
  TinyRunDir d;
  const std::string run = d.run_dir("run");
  const CommandResult r = run_and_signal(d.command("run", kLong + "--inject slow@save=30"),
                                         run + "/metrics.jsonl", {"TERM", "TERM"}, d.run_dir("run.log"));
  EXPECT_NE(r.output.find("exit=143"), std::string::npos) << r.output;  // 128 + SIGTERM: killed by it
  for (const std::string& c : ckpt::list_checkpoints(run + "/checkpoints")) EXPECT_NO_THROW(ckpt::verify_manifest(c));
  EXPECT_EQ(read_metrics(run).events_of("stopped").size(), 0u);
  const CommandResult resumed = d.train("run", "--resume auto --set training.train_iters=6");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
}

// Supervised: a child stopped by a signal (here: sent to the child itself) exits 3 and is not
// restarted; SIGTERM to the supervisor reaches the child through the stop file, with the same end;
// a second signal to the supervisor kills the child at once, not restarted either.
TEST(StopSignal, ASupervisedRunStoppedByTheUserIsNotRestarted) {
  TinyRunDir d;
  CommandResult r = d.train("child", "--max-restarts 2 --set training.train_iters=8 --inject sigterm@step=3");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("the training process stopped after writing a checkpoint; not restarting"), std::string::npos)
      << r.output;
  EXPECT_TRUE(read_metrics(d.run_dir("child")).events_of("resume").empty());

  const std::string run = d.run_dir("supervisor");
  r = run_and_signal(d.command("supervisor", kLong + "--max-restarts 2"), run + "/metrics.jsonl", {"TERM"},
                     d.run_dir("supervisor.log"));
  EXPECT_NE(r.output.find("exit=3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not restarting"), std::string::npos) << r.output;
  Metrics m = read_metrics(run);
  ASSERT_EQ(m.events_of("stopped").size(), 1u) << r.output;
  EXPECT_TRUE(m.events_of("resume").empty());
  for (const auto& e : fs::directory_iterator(run))
    EXPECT_FALSE(e.path().filename().string().starts_with("stop_requested")) << e.path();

  r = run_and_signal(d.command("twice", kLong + "--max-restarts 2 --inject slow@save=30"),
                     d.run_dir("twice") + "/metrics.jsonl", {"TERM", "TERM"}, d.run_dir("twice.log"),
                     "the run finishes its step");
  EXPECT_NE(r.output.find("exit=1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("was killed by signal 9"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not restarting"), std::string::npos) << r.output;
  EXPECT_TRUE(read_metrics(d.run_dir("twice")).events_of("resume").empty());
}
