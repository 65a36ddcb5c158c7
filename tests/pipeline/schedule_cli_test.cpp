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
  EXPECT_EQ(t["traceEvents"].size(), 4u * 8u * 3u);  // every F, B and W of every stage
  EXPECT_EQ(t["traceEvents"][0]["name"], "F0");

  const auto text = run_command(kSchedule + "--kind zb-h1 --pp 2 --microbatches 3");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("stage 1 |...F0 B0 F1 B1 W0 F2 B2 W1 W2 |"), std::string::npos) << text.output;
}

TEST(ScheduleCli, BadInputNamesWhatIsWrong) {
  const struct {
    const char* args;
    const char* message;
  } cases[] = {
      {"--kind dualpipe", "unknown pipeline schedule 'dualpipe' (known: none, 1f1b, interleaved, zb-h1, zb-h2, dualpipev)"},
      {"--kind dualpipev --pp 4 --vpp 2 --microbatches 6", "at least twice as many micro-batches"},
      {"--kind 1f1b --vpp 2", "one model chunk per stage, not 2"},
      {"--kind interleaved --pp 4 --vpp 2 --microbatches 6", "multiple of the pipeline stages"},
      {"--kind none --pp 2", "runs on one pipeline stage"},
      {"--costs F=0", "F = 0 is out of range"},
      {"--costs F=1,X=2", "'X=2' is not one of"},
      {"--costs W=abc", "'W=abc' is not a number"},
      {"--pp 0", "--pp"},
  };
  for (const auto& c : cases) {
    const auto r = run_command(kSchedule + c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
}
