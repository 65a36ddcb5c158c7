// `[training] recompute_*` end to end: a run with activation recompute trains bit for bit like
// the run without it (same losses, same final weights), in one process and at tp2 with sequence
// parallelism (the recomputed forwards repeat their collectives in B, in the same order on both
// ranks); bad values are refused naming the key.
#include <gtest/gtest.h>

#include "tiny_run.h"

using megaton::testing::CommandResult;
using megaton::testing::Metrics;
using megaton::testing::TinyRunDir;

namespace {
const std::string kShort = "--set training.train_iters=6 --set logging.save_interval=0 --set logging.log_interval=1 ";
const std::string kFull = "--set training.recompute_granularity=full --set training.recompute_method=uniform ";
const std::string kSelective = "--set training.recompute_granularity=selective --set training.recompute_modules=core_attn,mlp,layernorm ";

// A run that must succeed and print `banner`: its metrics.
Metrics train_printing(const TinyRunDir& run, const std::string& name, const std::string& args,
                       const std::string& banner) {
  const CommandResult r = run.train(name, args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(banner), std::string::npos) << r.output;
  return megaton::testing::read_metrics(run.run_dir(name));
}

void expect_same_run(const TinyRunDir& run, const Metrics& a, const std::string& a_dir, const Metrics& b,
                     const std::string& b_dir) {
  EXPECT_EQ(a.losses, b.losses);
  megaton::testing::expect_bitwise_equal(megaton::testing::final_weights(run.run_dir(a_dir)),
                                         megaton::testing::final_weights(run.run_dir(b_dir)));
}
}  // namespace

TEST(RecomputeRuns, TrainBitwiseLikeNoRecompute) {
  TinyRunDir run("llama-tiny");
  const Metrics plain = run.train_ok("plain", kShort);
  ASSERT_EQ(plain.losses.size(), 6u);
  expect_same_run(run, plain, "plain",
                  train_printing(run, "full", kShort + kFull, "| activation recompute full (uniform, 1 layer per unit)"),
                  "full");
  expect_same_run(run, plain, "plain",
                  train_printing(run, "selective", kShort + kSelective, "| activation recompute selective (core_attn, mlp, layernorm)"),
                  "selective");
}

TEST(RecomputeRuns, TensorAndSequenceParallelTrainBitwiseLikeNoRecompute) {
  TinyRunDir run("gpt-tiny");
  const std::string tp = kShort + "--set tp=2 --set parallel.sequence_parallel=true --set training.threads=1 ";
  const Metrics plain = run.train_mpi_ok(2, "tp2", tp, "tensor parallel 2 ranks");
  ASSERT_EQ(plain.losses.size(), 6u);
  const std::string layout = "tensor parallel 2 ranks + sequence parallel (parameters per rank) | activation recompute ";
  expect_same_run(run, plain, "tp2", run.train_mpi_ok(2, "tp2_full", tp + kFull, layout + "full"), "tp2_full");
  expect_same_run(run, plain, "tp2", run.train_mpi_ok(2, "tp2_selective", tp + kSelective, layout + "selective"),
                  "tp2_selective");
}

TEST(RecomputeRuns, BadSettingsAreRefusedNamingTheKey) {
  TinyRunDir run;
  for (const auto& [set, key] : std::vector<std::pair<std::string, std::string>>{
           {"training.recompute_granularity=some", "training.recompute_granularity"},
           {"training.recompute_granularity=full --set training.recompute_method=every", "training.recompute_method"},
           {"training.recompute_granularity=full --set training.recompute_num_layers=0", "training.recompute_num_layers"},
           {"training.recompute_granularity=selective --set training.recompute_modules=attn", "training.recompute_modules"}}) {
    const CommandResult r = run.train("bad", "--set " + set);
    EXPECT_NE(r.exit_code, 0) << set;
    EXPECT_NE(r.output.find(key), std::string::npos) << set << ": " << r.output;
  }
}
