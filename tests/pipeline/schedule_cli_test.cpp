// `megaton schedule` end to end: the figures it prints, the trace file, and its input errors.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "../support/run_command.h"
#include "../support/temp_dir.h"

using megaton::testing::run_command;

namespace {
const std::string kSchedule = std::string(MEGATON_BINARY) + " schedule ";
}

TEST(ScheduleCli, JsonFiguresAndTraceMatchTheSimulation) {
  megaton::testing::TempDir dir;
  const auto r = run_command(kSchedule + "--kind 1f1b --pp 4 --microbatches 8 --json --trace " + dir.file("t.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["schedule"], "1f1b");
  EXPECT_DOUBLE_EQ(j["step_time"].get<double>(), 8 * 3 + 3 * 3);  // m(F+B+W) + (p-1)(F+B+W)
  EXPECT_NEAR(j["bubble_fraction"].get<double>(), 9.0 / 33.0, 1e-12);
  EXPECT_EQ(j["peak_activations"], nlohmann::json({4, 3, 2, 1}));
  EXPECT_EQ(j["param_copies"], nlohmann::json({1, 1, 1, 1}));
  std::ifstream trace(dir.file("t.json"));
  const auto t = nlohmann::json::parse(trace);
  std::vector<nlohmann::json> ops;
  std::vector<std::string> rows;
  for (const auto& e : t["traceEvents"]) (e["ph"] == "X" ? ops.push_back(e) : rows.push_back(e["args"]["name"]));
  EXPECT_EQ(ops.size(), 4u * 8u * 3u);  // every F, B and W of every stage
  EXPECT_EQ(ops[0]["name"], "F0");
  EXPECT_EQ(rows, (std::vector<std::string>{"stage 0", "stage 1", "stage 2", "stage 3"}));

  const auto text = run_command(kSchedule + "--kind zb-h1 --pp 2 --microbatches 3");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("stage 1 |...F0 B0 F1 B1 W0 F2 B2 W1 W2 |"), std::string::npos) << text.output;
}

// DualPipe keeps two parameter copies; its F&B cost is FB= (F + B unless given). p = 4, m = 8:
// each stage runs 8 F, B, W (4 per direction and copy) and the bubble is the README's
// (PP/2-1)(F&B + B - 3W) with F&B = FB + W and the full backward B + W: 1 x (2 + 1 + 1 + 1 + 1 - 3) = 2
// at unit costs. ZB-V at unit costs: the work (2m(F+B+W) = 48) plus the (p-1)F offset.
TEST(ScheduleCli, DualPipeAndZbVFigures) {
  auto r = run_command(kSchedule + "--kind dualpipe --pp 4 --vpp 2 --microbatches 8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["schedule"], "dualpipe");
  EXPECT_DOUBLE_EQ(j["step_time"].get<double>(), 8 * 3 + 2);
  EXPECT_EQ(j["peak_activations"], nlohmann::json({5, 5, 5, 5}));
  EXPECT_EQ(j["param_copies"], nlohmann::json({2, 2, 2, 2}));
  // An F&B of 1.5 instead of 2 saves 0.5 on each of a stage's F&Bs; with p = 2 nothing waits.
  r = run_command(kSchedule + "--kind dualpipe --pp 2 --vpp 2 --microbatches 4 --costs F=1,B=1,W=1,FB=1.5 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(r.output)["step_time"].get<double>(), 12 - 0.5);

  r = run_command(kSchedule + "--kind zbv --pp 4 --vpp 2 --microbatches 8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  j = nlohmann::json::parse(r.output);
  EXPECT_DOUBLE_EQ(j["step_time"].get<double>(), 48 + 3);
  EXPECT_EQ(j["peak_activations"], nlohmann::json({8, 8, 8, 8}));
  EXPECT_EQ(j["param_copies"], nlohmann::json({1, 1, 1, 1}));

  const auto text = run_command(kSchedule + "--kind dualpipe --pp 2 --vpp 2 --microbatches 4");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  // Three characters per unit of time, labels cut to fit: the F&B takes two units.
  EXPECT_NE(text.output.find("stage 0 |F0 F2.F1 B2.W2.F3.1&BW0 B3.W3.B1 W1 |"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("parameter copies per stage: 2 2"), std::string::npos) << text.output;
}

TEST(ScheduleCli, BadInputNamesWhatIsWrong) {
  const struct {
    const char* args;
    const char* message;
  } cases[] = {
      {"--kind zb-v", "unknown pipeline schedule 'zb-v' (known: none, 1f1b, interleaved, zb-h1, zb-h2, zbv, dualpipe, "
                      "dualpipev)"},
      {"--kind dualpipe --pp 3 --vpp 2", "even number of pipeline stages, not 3"},
      {"--kind zbv", "schedule 'zbv' has two model chunks per stage (a V), not 1; pass --vpp 2"},
      {"--costs FB=0", "FB = 0 is out of range"},
      {"--kind dualpipev --pp 4 --vpp 2 --microbatches 6", "at least twice as many micro-batches"},
      {"--kind 1f1b --vpp 2", "one model chunk per stage, not 2"},
      {"--kind interleaved --pp 4 --vpp 2 --microbatches 6", "multiple of the pipeline stages"},
      {"--kind none --pp 2", "runs on one pipeline stage"},
      {"--costs F=0", "F = 0 is out of range"},
      {"--costs F=1,X=2", "'X=2' is not one of F=, B=, W=, T=, FB="},
      {"--costs W=abc", "'W=abc' is not a number"},
      {"--pp 0", "--pp"},
  };
  for (const auto& c : cases) {
    const auto r = run_command(kSchedule + c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
}
