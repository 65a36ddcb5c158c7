// Same config and seed -> bitwise-identical losses and weights; and the thread count does not
// change the result either (kernels reduce over fixed chunks, never per-thread partials; the
// OpenBLAS sgemm splits output tiles across threads but never the inner dimension).
#include <gtest/gtest.h>
#include <omp.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "megaton/train/trainer.h"
#include "tiny_run.h"

using namespace megaton;
using megaton::testing::expect_bitwise_equal;
using megaton::testing::TempDir;

namespace {

std::vector<double> losses_of(const std::string& metrics) {
  std::vector<double> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

std::map<std::string, Tensor> train_run(const std::string& data, const std::string& run_dir, const std::string& preset,
                                        int threads, std::vector<double>& losses) {
  auto cfg = train::load_train_config(
      "", {"model.preset=\"" + preset + "\"", "model.num_layers=2", "model.hidden_size=48", "model.ffn_hidden_size=96",
           "model.num_attention_heads=6", "model.num_query_groups=" + std::string(preset == "gpt-tiny" ? "6" : "2"),
           "data.data_path=\"" + data + "\"", "training.micro_batch_size=4", "training.global_batch_size=8",
           "training.seq_length=32", "training.train_iters=6", "training.threads=" + std::to_string(threads),
           "optimizer.lr_warmup_iters=2", "logging.run_dir=\"" + run_dir + "\"", "logging.peak_tflops=1.0"});
  train::Trainer(cfg).run();
  losses = losses_of(run_dir + "/metrics.jsonl");
  return ckpt::load_safetensors(run_dir + "/final/model.safetensors");
}

}  // namespace

class Determinism : public ::testing::TestWithParam<std::string> {};

TEST_P(Determinism, SameSeedTwiceAndOneVsTwoThreadsAreBitwiseEqual) {
  TempDir dir;
  megaton::testing::write_byte_dataset(dir.file("data"), 200);
  std::vector<double> l1, l2, l3;
  auto w1 = train_run(dir.file("data"), dir.file("run1"), GetParam(), 2, l1);
  auto w2 = train_run(dir.file("data"), dir.file("run2"), GetParam(), 2, l2);
  auto w3 = train_run(dir.file("data"), dir.file("run3"), GetParam(), 1, l3);
  ASSERT_EQ(l1.size(), 6u);
  EXPECT_LT(l1.back(), l1.front());  // it learns
  EXPECT_EQ(l1, l2);
  expect_bitwise_equal(w1, w2);
  EXPECT_EQ(l1, l3);
  expect_bitwise_equal(w1, w3);
}

INSTANTIATE_TEST_SUITE_P(Models, Determinism, ::testing::Values("gpt-tiny", "llama-tiny"));

// A fresh run into a directory an earlier run left (without checkpoints) starts metrics.jsonl
// afresh instead of appending to the earlier run's records.
TEST(Metrics, FreshRunStartsItsOwnMetricsFile) {
  TempDir dir;
  megaton::testing::write_byte_dataset(dir.file("data"), 100);
  std::vector<double> first, second;
  train_run(dir.file("data"), dir.file("run"), "gpt-tiny", 2, first);
  train_run(dir.file("data"), dir.file("run"), "gpt-tiny", 2, second);
  EXPECT_EQ(second.size(), 6u);
  EXPECT_EQ(first, second);
}
