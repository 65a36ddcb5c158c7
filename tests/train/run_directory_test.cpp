// What a run finds in its run directory (issue 8, principles 2 and 4): it must be writable, checked
// before anything runs; an earlier run's results are never silently replaced (--resume continues,
// --overwrite starts over); checkpoints that fail verification are moved aside, never overwritten or
// deleted, and a run whose checkpoints all fail is an error unless the user starts over; the final
// export is retried and, failing, leaves the last checkpoint and says where it is.
#include <gtest/gtest.h>

#include "megaton/ckpt/checkpoint_dir.h"
#include "megaton/ckpt/manifest.h"
#include "tiny_run.h"

using namespace megaton;
using namespace megaton::testing;
namespace fs = std::filesystem;

namespace {

const std::string kShort = "--set training.train_iters=6 --set logging.save_interval=2 ";

void corrupt(const std::string& checkpoint) {
  std::ofstream(checkpoint + "/state.json", std::ios::app) << " ";
}

}  // namespace

TEST(RunDirectory, AnUnwritableRunDirectoryFailsBeforeTraining) {
  TinyRunDir d;
  write_bytes(d.run_dir("file"), "x");
  struct Case {
    std::string run_dir, message;
  };
  for (const Case& c : std::vector<Case>{
           {d.run_dir("file"), "config key 'logging.run_dir': '" + d.run_dir("file") + "' is a file, not a directory"},
           {d.run_dir("file") + "/run", "config key 'logging.run_dir': cannot create '" + d.run_dir("file") + "/run': '" +
                                            d.run_dir("file") + "' is a file, not a directory"},
           // Not writable even by root (sysfs): the probe answers where access() would not.
           {"/sys/megaton_run", "config key 'logging.run_dir': cannot create '/sys/megaton_run': '/sys' is not writable"},
       }) {
    const CommandResult r = run_command(std::string(MEGATON_BINARY) + " train --config " + d.run_dir("run.toml") +
                                        " --set logging.run_dir='\"" + c.run_dir + "\"'");
    EXPECT_NE(r.exit_code, 0) << c.run_dir;
    EXPECT_NE(r.output.find("error: " + c.message), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("step "), std::string::npos) << "trained:\n" << r.output;
  }
  EXPECT_EQ(read_bytes(d.run_dir("file")), "x");
}

// A finished run's directory: a fresh start is refused and changes nothing; --overwrite starts over
// (the old checkpoints go, checkpoints moved aside stay); a finished run without checkpoints cannot
// be "resumed" from step 0 by --resume auto.
TEST(RunDirectory, AFinishedRunIsNeverSilentlyReplaced) {
  TinyRunDir d;
  const std::string run = d.run_dir("run");
  ASSERT_EQ(d.train("run", kShort).exit_code, 0);
  const std::string metrics = read_bytes(run + "/metrics.jsonl");
  const std::string final_model = read_bytes(run + "/final/model.safetensors");
  CommandResult r = d.train("run", kShort);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("'" + run + "' already holds a run (metrics.jsonl, final/, checkpoints/): pass --resume auto "
                          "to continue it, --overwrite to start over in its place"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(read_bytes(run + "/metrics.jsonl"), metrics);
  EXPECT_EQ(read_bytes(run + "/final/model.safetensors"), final_model);

  fs::rename(run + "/checkpoints/step_000002", run + "/checkpoints/step_000002.corrupt");
  r = d.train("run", kShort + "--overwrite --set training.train_iters=8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_metrics(run).losses.size(), 8u);  // a new run, not the old one's records
  EXPECT_EQ(ckpt::list_checkpoints(run + "/checkpoints"),  // keep_last 3: the new step 2 went, the moved one stays
            (std::vector<std::string>{run + "/checkpoints/step_000008", run + "/checkpoints/step_000006",
                                      run + "/checkpoints/step_000004"}));
  EXPECT_TRUE(fs::exists(run + "/checkpoints/step_000002.corrupt"));

  ASSERT_EQ(d.train("no_ckpt", "--set training.train_iters=6 --set logging.save_interval=0").exit_code, 0);
  r = d.train("no_ckpt", "--resume auto --set training.train_iters=6 --set logging.save_interval=0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("holds a finished run (final/) but no checkpoint to continue it from"), std::string::npos)
      << r.output;
}

// The newest checkpoint fails verification: it is moved aside (reported, recorded in the metrics),
// the run resumes from the one before, and saving that step again does not touch the moved one.
TEST(RunDirectory, ARejectedCheckpointIsMovedAsideAndKept) {
  TinyRunDir d;
  const std::string run = d.run_dir("run");
  ASSERT_EQ(d.train("run", kShort).exit_code, 0);
  corrupt(run + "/checkpoints/step_000006");
  const std::string bad = read_bytes(run + "/checkpoints/step_000006/state.json");
  const CommandResult r = d.train("run", "--resume auto --set training.train_iters=8 --set logging.save_interval=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("moved aside to " + run + "/checkpoints/step_000006.corrupt"), std::string::npos) << r.output;
  const Metrics m = read_metrics(run);
  ASSERT_EQ(m.events_of("checkpoint_rejected").size(), 1u);
  EXPECT_EQ(m.events_of("checkpoint_rejected")[0]["moved_to"], run + "/checkpoints/step_000006.corrupt");
  EXPECT_EQ(m.events_of("resume")[0]["step"], 4);
  EXPECT_EQ(read_bytes(run + "/checkpoints/step_000006.corrupt/state.json"), bad);
  EXPECT_NO_THROW(ckpt::verify_manifest(run + "/checkpoints/step_000006"));  // saved again, afresh
}

// Every checkpoint fails: --resume auto is an error (again on a second try: they stay moved aside)
// until --overwrite says to start over from step 0.
TEST(RunDirectory, ResumingWhenEveryCheckpointFailsIsAnErrorUnlessStartingOver) {
  TinyRunDir d;
  const std::string run = d.run_dir("run");
  ASSERT_EQ(d.train("run", kShort).exit_code, 0);
  for (const std::string& c : ckpt::list_checkpoints(run + "/checkpoints")) corrupt(c);
  for (int attempt = 0; attempt < 2; ++attempt) {
    const CommandResult r = d.train("run", kShort + "--resume auto");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("error: --resume auto: no checkpoint in " + run + "/checkpoints passes verification (3 "
                            "moved aside"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("pass --overwrite to start over from step 0"), std::string::npos) << r.output;
  }
  EXPECT_EQ(ckpt::list_moved_aside(run + "/checkpoints").size(), 3u);
  const CommandResult r = d.train("run", kShort + "--resume auto --overwrite");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Metrics m = read_metrics(run);
  EXPECT_TRUE(m.events_of("resume").empty());
  EXPECT_EQ(m.losses.size(), 6u);
  EXPECT_EQ(ckpt::list_moved_aside(run + "/checkpoints").size(), 3u);
}

// The final export is retried like a checkpoint write; when every attempt fails, the run fails
// naming the checkpoint that holds the trained weights, intact, and leaves no partial final/.
TEST(RunDirectory, AFailedFinalExportIsRetriedThenNamesTheLastCheckpoint) {
  TinyRunDir d;
  CommandResult r = d.train("retried", kShort + "--inject fail@final");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: writing the final model " + d.run_dir("retried") + "/final failed (attempt 1 of 3)"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(d.run_dir("retried") + "/final/model.safetensors"));

  const std::string run = d.run_dir("failed");
  r = d.train("failed", kShort + "--inject fail@final --set checkpoint.write_attempts=1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("error: writing the final model " + run + "/final failed after 1 attempts: injected fault "
                          "fail@final"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("the newest checkpoint is " + run + "/checkpoints/step_000006, which holds the trained weights"),
            std::string::npos)
      << r.output;
  EXPECT_NO_THROW(ckpt::verify_manifest(run + "/checkpoints/step_000006"));
  EXPECT_FALSE(fs::exists(run + "/final"));
  EXPECT_FALSE(fs::exists(run + "/final.tmp"));
}
