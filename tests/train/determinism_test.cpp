// Same config, seed and thread count -> bitwise-identical losses and weights. Across thread counts
// Megaton's own kernels stay bitwise equal (they reduce over fixed chunks, never per-thread
// partials; each kernel test checks 1 vs 2 threads), but OpenBLAS's sgemm does not on every CPU:
// on an AVX2 Zen 3 its 1- and 2-thread results differ in the last bits for every GEMM shape of
// these models, while on an AVX-512 Zen 4 they were equal. So 1 vs 2 threads must agree to fp32
// rounding (a race or a thread-dependent bug is many orders of magnitude larger), not bitwise.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
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
                                        int threads, std::vector<double>& losses, train::RunOptions options = {}) {
  auto cfg = train::load_train_config(
      "", {"model.preset=\"" + preset + "\"", "model.num_layers=2", "model.hidden_size=48", "model.ffn_hidden_size=96",
           "model.num_attention_heads=6", "model.num_query_groups=" + std::string(preset == "gpt-tiny" ? "6" : "2"),
           "data.data_path=\"" + data + "\"", "training.micro_batch_size=4", "training.global_batch_size=8",
           "training.seq_length=32", "training.train_iters=6", "training.threads=" + std::to_string(threads),
           "optimizer.lr=1e-4", "optimizer.lr_warmup_iters=2", "logging.run_dir=\"" + run_dir + "\"", "logging.peak_tflops=1.0"});
  train::Trainer(cfg, options).run();
  losses = losses_of(run_dir + "/metrics.jsonl");
  return ckpt::load_safetensors(run_dir + "/final/model.safetensors");
}

// Every |a - b| within tol (NaN-proof: a non-finite difference fails).
void expect_close(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    const float* x = t.data<float>();
    const float* y = b.at(name).data<float>();
    double diff = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double d = std::abs(double(x[i]) - double(y[i]));
      if (!(d <= diff)) diff = d;  // a NaN difference sticks
    }
    EXPECT_TRUE(diff <= tol) << name << ": max difference " << diff << ", allowed " << tol;
  }
}

}  // namespace

class Determinism : public ::testing::TestWithParam<std::string> {};

TEST_P(Determinism, SameSeedTwiceIsBitwiseEqualAndOneVsTwoThreadsAgreeToRounding) {
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
  ASSERT_EQ(l1.size(), l3.size());
  for (size_t i = 0; i < l1.size(); ++i) EXPECT_NEAR(l1[i], l3[i], 1e-5 * std::abs(l1[i])) << "step " << i + 1;
  // Adam moves a weight by up to ~lr per step whatever the gradient's size, so an element whose
  // gradient is near zero can take a different step from a last-bit difference: allow 5% of the
  // largest possible movement (a wrong or racy gradient moves weights by up to all of it).
  expect_close(w1, w3, 0.05 * 1e-4 * 6);
}

INSTANTIATE_TEST_SUITE_P(Models, Determinism, ::testing::Values("gpt-tiny", "llama-tiny"));

// A fresh run into a directory an earlier run left (without checkpoints) is refused unless told to
// overwrite it (run_directory_test); then it starts metrics.jsonl afresh instead of appending to the
// earlier run's records.
TEST(Metrics, FreshRunStartsItsOwnMetricsFile) {
  TempDir dir;
  megaton::testing::write_byte_dataset(dir.file("data"), 100);
  std::vector<double> first, second;
  train_run(dir.file("data"), dir.file("run"), "gpt-tiny", 2, first);
  train_run(dir.file("data"), dir.file("run"), "gpt-tiny", 2, second, {.resume = "", .overwrite = true, .inject = {}});
  EXPECT_EQ(second.size(), 6u);
  EXPECT_EQ(first, second);
}
