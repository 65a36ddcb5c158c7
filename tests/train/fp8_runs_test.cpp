// FP8 training end to end (`[precision] fp8`): gpt-tiny and llama-tiny train under every recipe to
// a validation loss close to the fp32 run's; a bad recipe or format is refused up front naming the key.
#include <gtest/gtest.h>

#include <cmath>

#include "tiny_run.h"

using megaton::testing::Metrics;
using megaton::testing::TinyRunDir;
using megaton::testing::CommandResult;

TEST(Fp8Runs, EveryRecipeTrainsCloseToFp32) {
  for (const std::string preset : {"gpt-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    TinyRunDir dir(preset);
    const Metrics f32 = dir.train_ok("f32");
    ASSERT_TRUE(std::isfinite(f32.final_val_loss));
    // Every recipe on gpt-tiny; llama-tiny (GQA, SwiGLU, no biases) with the DeepSeek-V3 one.
    for (const std::string& recipe : preset == "gpt-tiny" ? std::vector<std::string>{"delayed", "tensorwise", "blockwise", "mxfp8"}
                                                         : std::vector<std::string>{"blockwise"}) {
      const std::string format = recipe == "delayed" || recipe == "tensorwise" ? "hybrid" : "e4m3";
      const Metrics fp8 = dir.train_ok(recipe, "--set precision.fp8=" + format + " --set precision.fp8_recipe=" + recipe);
      ASSERT_TRUE(std::isfinite(fp8.final_val_loss)) << recipe;
      // 60 steps of a tiny model: FP8 rounding moves the validation loss by a few percent at most.
      EXPECT_NEAR(fp8.final_val_loss, f32.final_val_loss, 0.03 * f32.final_val_loss) << recipe;
      EXPECT_NE(fp8.final_val_loss, f32.final_val_loss) << recipe << " did not run in FP8";
    }
  }
}

TEST(Fp8Runs, BadSettingsAreRefusedNamingTheKey) {
  TinyRunDir dir;
  for (const auto& [set, key] : std::vector<std::pair<std::string, std::string>>{
           {"precision.fp8=e5m2", "precision.fp8"},
           {"precision.fp8=hybrid --set precision.fp8_recipe=current", "precision.fp8_recipe"},
           {"precision.fp8=hybrid --set precision.fp8_margin=-1", "precision.fp8_margin"},
           {"precision.fp8=hybrid --set precision.fp8_amax_history_len=0", "precision.fp8_amax_history_len"},
           {"precision.fp8=hybrid --set precision.fp8_amax_compute_algo=mean", "precision.fp8_amax_compute_algo"}}) {
    const CommandResult r = dir.train("bad", "--set " + set);
    EXPECT_NE(r.exit_code, 0) << set;
    EXPECT_NE(r.output.find(key), std::string::npos) << set << ": " << r.output;
  }
}
