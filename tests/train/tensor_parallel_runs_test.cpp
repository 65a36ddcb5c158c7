// Tensor and sequence parallelism end to end: `mpirun -np N megaton train --set tp=2` trains the
// tiny GPT and Llama (GQA) models like one process (per-step losses and grad norms within 1e-5
// relative, final weights within 1e-5): tp2, tp2 with sequence parallelism, dp2 x tp2 on four
// ranks with and without the distributed optimizer. The tiny models' vocabulary of 257 does not
// divide by 2, so every run also pads the vocabulary (258 rows, the padding never predicted and
// not exported). kv heads fewer than the ranks are replicated; sharded checkpoints reshard between
// layouts and convert to an HF folder; bad layouts are refused naming the sizes.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "megaton/ckpt/safetensors.h"
#include "tiny_run.h"

using megaton::testing::Metrics;
using megaton::testing::TinyRunDir;
using Variant = megaton::testing::MpiVariant;

namespace {

const std::string kShort = "--set training.train_iters=10 --set logging.save_interval=0 --set training.threads=1 ";

// Losses and grad norms within 1e-5 relative, weights within 1e-4 (tiny_run.h: the rounding floor
// of the single-process run itself).
void expect_like(const TinyRunDir& run, const Metrics& got, const std::string& name, const Metrics& want,
                 const std::string& want_name) {
  ASSERT_EQ(got.losses.size(), 10u) << name;
  megaton::testing::expect_close_training(got, want, run.run_dir(name), run.run_dir(want_name), name, 1e-4);
}

class TensorParallelRuns : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorParallelRuns, TrainLikeOneProcess) {
  TinyRunDir run(GetParam());
  const Metrics single = run.train_ok("single", kShort);
  for (const Variant& v :
       {Variant{"tp2", 2, "--set tp=2", "tensor parallel 2 ranks (parameters"},
        Variant{"tp2_sp", 2, "--set tp=2 --set parallel.sequence_parallel=true",
                "tensor parallel 2 ranks + sequence parallel"},
        Variant{"dp2_tp2", 4, "--set tp=2 --set parallel.sequence_parallel=true",
                "tensor parallel 2 ranks + sequence parallel (parameters per rank) | data parallel 2 ranks"},
        Variant{"dp2_tp2_zero", 4, "--set tp=2 --set parallel.use_distributed_optimizer=true --set parallel.bucket_size=4000",
                "data parallel 2 ranks, distributed optimizer"}}) {
    const Metrics got = run.train_mpi_ok(v.np, v.name, kShort + v.args, v.banner);
    expect_like(run, got, v.name, single, "single");
    for (const auto& rec : got.steps) EXPECT_TRUE(rec.contains("comm_wait_s")) << v.name << " " << rec.dump();
  }
  // The export holds the real vocabulary only: the padding row is stripped.
  const auto weights = megaton::testing::final_weights(run.run_dir("tp2"));
  const std::string embedding = GetParam() == "gpt-tiny" ? "transformer.wte.weight" : "model.embed_tokens.weight";
  EXPECT_EQ(weights.at(embedding).size(0), 257);
}

INSTANTIATE_TEST_SUITE_P(Models, TensorParallelRuns, ::testing::Values("gpt-tiny", "llama-tiny"),
                         [](const auto& info) { return info.param == "gpt-tiny" ? "gpt" : "llama"; });

// One kv head, two ranks: each rank holds 3 query heads and a copy of the kv head, whose gradient
// is summed over both.
TEST(TensorParallel, ReplicatedKvHeadsTrainLikeOneProcess) {
  TinyRunDir run("llama-tiny");
  const std::string mqa = "--set model.num_query_groups=1 ";
  const Metrics single = run.train_ok("single", kShort + mqa);
  const Metrics tp = run.train_mpi_ok(2, "tp2", kShort + mqa + "--set tp=2 --set parallel.sequence_parallel=true",
                                  "tensor parallel 2 ranks");
  expect_like(run, tp, "tp2", single, "single");
}

// A padded vocabulary at tp 1 (make_vocab_size_divisible_by 64: 320 rows) trains as the unpadded
// model (to the GEMMs' rounding for another shape): the padding is never predicted and never
// exported.
TEST(TensorParallel, VocabularyPaddingIsNeverPredicted) {
  TinyRunDir run("gpt-tiny");
  const Metrics plain = run.train_ok("plain", kShort);
  const Metrics padded = run.train_ok("padded", kShort + "--set model.make_vocab_size_divisible_by=64");
  expect_like(run, padded, "padded", plain, "plain");
}

// Checkpoints are sharded: every rank writes its pieces of the global tensors, the second
// data-parallel replica nothing. A checkpoint saved at tp2 x dp2 (four ranks, sequence parallel)
// continues at tp1 x dp4 and in one process, and a single process's continues at tp2, like the
// uninterrupted run. `megaton convert` assembles a tp2 checkpoint into the very weights the run
// exports (bitwise).
TEST(TensorParallel, ShardedCheckpointsReshardAcrossLayouts) {
  namespace fs = std::filesystem;
  TinyRunDir run("llama-tiny");
  const Metrics straight = run.train_ok("straight", kShort);
  const std::string stop = "--set training.exit_interval=5 ";
  const std::string tp2 = "--set tp=2 --set parallel.sequence_parallel=true ";
  EXPECT_EQ(run.train_mpi_ok(4, "tp2_dp2", kShort + tp2 + stop, "data parallel 2 ranks").losses.size(), 5u);
  const std::string ckpt = run.run_dir("tp2_dp2") + "/checkpoints/step_000005";
  const auto metadata = nlohmann::json::parse(megaton::testing::read_bytes(ckpt + "/metadata.json"));
  EXPECT_EQ(metadata["world_size"], 4);
  std::set<std::string> files;
  for (const auto& [name, t] : metadata["tensors"].items())
    for (const auto& piece : t["pieces"]) files.insert(piece["file"].get<std::string>());
  EXPECT_EQ(files, (std::set<std::string>{"shard_00000.safetensors", "shard_00001.safetensors"}));
  for (const auto& [name, layout] : std::vector<std::pair<std::string, std::string>>{
           {"at_dp4", "--set parallel.use_distributed_optimizer=true --set training.micro_batch_size=2 "}, {"at_dp1", ""}}) {
    SCOPED_TRACE(name);
    fs::copy(run.run_dir("tp2_dp2"), run.run_dir(name), fs::copy_options::recursive);
    const Metrics resumed = name == "at_dp4" ? run.train_mpi_ok(4, name, kShort + layout + "--resume auto", "data parallel 4")
                                             : run.train_ok(name, kShort + "--resume auto");
    expect_like(run, resumed, name, straight, "straight");
  }
  EXPECT_EQ(run.train_ok("from_tp1", kShort + stop).losses.size(), 5u);
  const Metrics at_tp2 = run.train_mpi_ok(2, "from_tp1", kShort + tp2 + "--resume auto", "tensor parallel");
  expect_like(run, at_tp2, "from_tp1", straight, "straight");

  // The tp2 run's last checkpoint, converted, is its exported final/ byte for byte.
  run.train_mpi_ok(2, "tp2", kShort + tp2 + "--set logging.save_interval=10", "tensor parallel");
  const std::string hf = run.run_dir("converted");
  const auto converted = megaton::testing::run_command(std::string(MEGATON_BINARY) + " convert --input " +
                                                       run.run_dir("tp2") + "/checkpoints --output " + hf);
  ASSERT_EQ(converted.exit_code, 0) << converted.output;
  megaton::testing::expect_bitwise_equal(megaton::ckpt::load_safetensors(hf + "/model.safetensors"),
                                         megaton::testing::final_weights(run.run_dir("tp2")));
  // Never over something that exists.
  const auto again = megaton::testing::run_command(std::string(MEGATON_BINARY) + " convert --input " +
                                                   run.run_dir("tp2") + "/checkpoints --output " + hf);
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE(again.output.find("already exists"), std::string::npos) << again.output;
}

TEST(TensorParallel, BadLayoutsNameTheSizes) {
  TinyRunDir run("gpt-tiny");
  // 6 heads do not split over 4 ranks.
  megaton::testing::CommandResult r = run.train_mpi(4, "heads", kShort + "--set tp=4", 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("num_attention_heads 6 is not divisible by tensor_model_parallel_size 4"), std::string::npos)
      << r.output;
  // tp 2 does not divide a world of 3.
  r = run.train_mpi(3, "world", kShort + "--set tp=2", 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("world size 3 is not divisible by tensor_model_parallel_size 2"), std::string::npos)
      << r.output;
  // Sequence parallelism without tensor parallelism.
  r = run.train("sp", kShort + "--set parallel.sequence_parallel=true");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("needs parallel.tensor_model_parallel_size > 1"), std::string::npos) << r.output;
}

}  // namespace
