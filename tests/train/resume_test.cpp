// Exact resume: training N steps straight and training k steps, stopping and resuming for N-k
// give bitwise-identical losses and weights; a corrupted checkpoint is reported by name and the
// previous valid one is used, still ending bitwise equal to the clean run.
#include <gtest/gtest.h>

#include <filesystem>

#include "tiny_run.h"

using namespace megaton::testing;
namespace fs = std::filesystem;

class Resume : public ::testing::TestWithParam<std::string> {};

TEST_P(Resume, StopAndResumeEqualsTrainingStraightBitwise) {
  TinyRunDir d(GetParam());
  const Metrics a = d.train_ok("clean");
  EXPECT_EQ(d.train_ok("stopped", "--set training.exit_interval=25").losses.size(), 25u);
  EXPECT_FALSE(fs::exists(d.run_dir("stopped") + "/final"));
  auto again = d.train("stopped");  // a fresh start next to checkpoints is refused
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE(again.output.find("--resume auto"), std::string::npos) << again.output;
  const Metrics b = d.train_ok("stopped", "--resume auto");
  ASSERT_EQ(a.losses.size(), 60u);
  EXPECT_EQ(a.losses, b.losses);
  ASSERT_GT(a.final_val_loss, 0);  // logged, so that the comparison below means something
  EXPECT_EQ(a.final_val_loss, b.final_val_loss);
  ASSERT_EQ(b.events_of("resume").size(), 1u);
  EXPECT_EQ(b.events_of("resume")[0]["step"], 25);
  expect_bitwise_equal(final_weights(d.run_dir("clean")), final_weights(d.run_dir("stopped")));

  // --resume PATH: another run directory continues from the clean run's step-40 checkpoint.
  d.train_ok("from_path", "--resume " + d.run_dir("clean") + "/checkpoints/step_000040");
  expect_bitwise_equal(final_weights(d.run_dir("clean")), final_weights(d.run_dir("from_path")));
}

INSTANTIATE_TEST_SUITE_P(Models, Resume, ::testing::Values("gpt-tiny", "llama-tiny"));

// BF16 mixed precision resumes bitwise too: the compute copies are re-rounded from the restored
// fp32 main weights before the first resumed step.
TEST(Resume, Bf16StopAndResumeEqualsTrainingStraightBitwise) {
  TinyRunDir d("llama-tiny");
  const std::string bf16 = "--set precision.bf16=true ";
  const Metrics a = d.train_ok("clean", bf16);
  EXPECT_EQ(d.train_ok("stopped", bf16 + "--set training.exit_interval=25").losses.size(), 25u);
  const Metrics b = d.train_ok("stopped", bf16 + "--resume auto");
  ASSERT_EQ(a.losses.size(), 60u);
  EXPECT_EQ(a.losses, b.losses);
  expect_bitwise_equal(final_weights(d.run_dir("clean")), final_weights(d.run_dir("stopped")));
  // The flag reached the model, and bf16 trains like f32 (stale compute copies would not learn).
  const Metrics f = d.train_ok("f32");
  EXPECT_NE(f.losses, a.losses);
  const double last_bf16 = a.losses.rbegin()->second, last_f32 = f.losses.rbegin()->second;
  EXPECT_NEAR(last_bf16, last_f32, 0.05 * last_f32);
  EXPECT_LT(last_f32, 0.8 * f.losses.begin()->second);
}

TEST(Resume, CorruptCheckpointsAreReportedByNameAndThePreviousOneIsUsed) {
  TinyRunDir d;
  const Metrics clean = d.train_ok("clean");
  d.train_ok("run", "--set training.exit_interval=30");
  const std::string ckpts = d.run_dir("run") + "/checkpoints";
  ASSERT_EQ(read_bytes(ckpts + "/latest"), "step_000030\n");

  // step 30: a truncated shard; step 20: one flipped bit in another.
  const std::string truncated = ckpts + "/step_000030/shard_00000.safetensors";
  fs::resize_file(truncated, fs::file_size(truncated) - 100);
  const std::string flipped = ckpts + "/step_000020/shard_00000.safetensors";
  std::string bytes = read_bytes(flipped);
  bytes[bytes.size() / 2] ^= 0x10;
  write_bytes(flipped, bytes);

  // Named explicitly, a corrupt checkpoint is an error naming the file.
  auto bad = d.train("elsewhere", "--resume " + ckpts + "/step_000030");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find(truncated), std::string::npos) << bad.output;
  EXPECT_FALSE(fs::exists(d.run_dir("elsewhere")));

  auto resumed = d.train("run", "--resume auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(truncated + ": "), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("truncated"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find(flipped + ": checksum mismatch"), std::string::npos) << resumed.output;
  const Metrics m = read_metrics(d.run_dir("run"));
  ASSERT_EQ(m.events_of("checkpoint_rejected").size(), 2u);
  ASSERT_EQ(m.events_of("resume").size(), 1u);
  EXPECT_EQ(m.events_of("resume")[0]["step"], 10);
  EXPECT_EQ(m.losses, clean.losses);
  expect_bitwise_equal(final_weights(d.run_dir("clean")), final_weights(d.run_dir("run")));
}
