// `megaton plan` end to end: the JSON a prediction prints next to the run it predicts, the trace,
// the search's runnable layouts, the shipped systems, and bad input named.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../support/run_command.h"
#include "../support/temp_dir.h"

using megaton::testing::run_command;

namespace {
const std::string kPlan = std::string(MEGATON_BINARY) + " plan ";
}

TEST(PlanCli, JsonHasThePredictedFiguresAndTheTraceEveryStage) {
  megaton::testing::TempDir dir;
  const auto r = run_command(kPlan + "--system h100 --devices 4 --set pp=2 --set tp=2 --set training.global_batch_size=32 "
                                     "--set training.micro_batch_size=4 --json --trace " + dir.file("t.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  for (const char* key : {"step_time_s", "tokens_per_s", "mfu", "peak_memory_bytes"}) {
    ASSERT_TRUE(j.contains(key)) << key;
    EXPECT_TRUE(std::isfinite(j[key].get<double>()) && j[key].get<double>() > 0) << key;
  }
  EXPECT_EQ(j["parallel"]["tensor_model_parallel_size"], 2);
  EXPECT_EQ(j["parallel"]["data_parallel_size"], 1);
  EXPECT_EQ(j["microbatches"], 8);
  EXPECT_NEAR(j["tokens_per_s"].get<double>(), 32.0 * 128 / j["step_time_s"].get<double>(), 1e-6);
  std::ifstream in(dir.file("t.json"));
  const auto trace = nlohmann::json::parse(in);
  size_t forwards = 0;
  for (const auto& e : trace["traceEvents"]) forwards += e.value("name", "").starts_with("F");
  EXPECT_EQ(forwards, 2u * 8u);  // each stage's forwards of the 8 micro-batches
}

TEST(PlanCli, SearchPrintsRunnableLayoutsFastestFirst) {
  const auto r = run_command(kPlan + "--search --model gpt-tiny --system h100 --devices 4 --global-batch 16 "
                                     "--seq-len 128 --top 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j["best"].size(), 4u);
  EXPECT_GT(j["planned"].get<int>(), 4);
  double last = 0;
  for (const auto& b : j["best"]) {
    EXPECT_GE(b["step_time_s"].get<double>(), last);
    last = b["step_time_s"].get<double>();
    // The printed settings plan again (through the training config's checks) to the same time.
    std::string sets;
    std::string settings = b["settings"];
    for (size_t at = 0; at != std::string::npos;) {
      const size_t next = settings.find(' ', at);
      sets += " --set '" + settings.substr(at, next == std::string::npos ? next : next - at) + "'";
      at = next == std::string::npos ? next : next + 1;
    }
    const auto again = run_command(kPlan + "--system h100 --devices 4 --set training.seq_length=128 "
                                           "--set training.global_batch_size=16 --json" + sets);
    ASSERT_EQ(again.exit_code, 0) << again.output;
    EXPECT_DOUBLE_EQ(nlohmann::json::parse(again.output)["step_time_s"].get<double>(), last) << sets;
  }
}

TEST(PlanCli, SystemsAreListedAndPrintedAsFiles) {
  const auto list = run_command(kPlan + "systems");
  ASSERT_EQ(list.exit_code, 0) << list.output;
  for (const char* name : {"a100", "h100", "h200", "b200"}) EXPECT_NE(list.output.find(name), std::string::npos);
  megaton::testing::TempDir dir;
  const auto printed = run_command(kPlan + "systems --print h200 > " + dir.file("h200.toml"));
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  const auto r = run_command(kPlan + "--system " + dir.file("h200.toml") + " --devices 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["system"], "h200");
}

TEST(PlanCli, BadInputIsNamed) {
  const auto expect_error = [](const std::string& args, const std::string& words) {
    const auto r = run_command(kPlan + args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.output.find(words), std::string::npos) << args << "\n" << r.output;
  };
  expect_error("--system no-such-system --devices 1", "no-such-system");
  expect_error("--devices 1", "--system");
  expect_error("--system h100 --devices 3 --set tp=2", "tensor_model_parallel_size");
  expect_error("--system h100 --devices 0", "--devices");
  expect_error("--system h100 --search --devices 4", "--model");
}
