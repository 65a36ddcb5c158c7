// FP16 training end to end (`[precision] fp16`, Megatron's --fp16 with dynamic loss scaling):
// gpt-tiny and llama-tiny train to a validation loss close to the fp32 run's; an injected gradient
// overflow skips its step (no update, loss scale halved) and training goes on; bad settings are
// refused naming the key.
#include <gtest/gtest.h>

#include <cmath>

#include "tiny_run.h"

using megaton::testing::CommandResult;
using megaton::testing::Metrics;
using megaton::testing::TinyRunDir;

namespace {
// 2^10: the tiny models' gradients fit fp16 at this scale, so only injected overflows skip steps.
const std::string kFp16 = "--set precision.fp16=true --set precision.initial_loss_scale=1024 ";
}  // namespace

TEST(Fp16Runs, TrainsCloseToFp32) {
  for (const std::string preset : {"gpt-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    TinyRunDir dir(preset);
    const Metrics f32 = dir.train_ok("f32");
    const Metrics f16 = dir.train_ok("f16", kFp16);
    ASSERT_TRUE(std::isfinite(f16.final_val_loss));
    EXPECT_NEAR(f16.final_val_loss, f32.final_val_loss, 0.01 * f32.final_val_loss) << f16.final_val_loss << " vs " << f32.final_val_loss;
    EXPECT_NE(f16.final_val_loss, f32.final_val_loss) << "fp16 did not run";
    // The same weights at step 1: the unscaled gradients' norm agrees to fp16 rounding (AdamW and
    // clipping would hide gradients left scaled; the norm does not).
    const double n32 = f32.last.at(1).at("grad_norm"), n16 = f16.last.at(1).at("grad_norm");
    EXPECT_NEAR(n16, n32, 1e-2 * n32);
    for (const auto& rec : f16.steps) {
      EXPECT_EQ(rec.at("loss_scale"), 1024.0) << rec;  // no overflow: the scale stays (window 1000)
      EXPECT_FALSE(rec.contains("skipped")) << rec;
    }
  }
}

// The skipped step does not advance the lr schedule (Megatron steps its scheduler after successful
// updates only): step s > 5 runs at the lr of the clean run's step s - 1.
// Planted: the gradients left scaled (TrainsCloseToFp32's grad norm), caught; the overflowing
// step's update not skipped (the NaN gradient reaches AdamW and the run
// diverges, exit 1): caught; the scale not lowered: caught; the schedule indexed by step: caught.
TEST(Fp16Runs, AnOverflowSkipsTheStepAndHalvesTheScale) {
  TinyRunDir dir("gpt-tiny");
  const std::string args = kFp16 + "--set precision.hysteresis=1 --set training.train_iters=12 ";
  const Metrics m = dir.train_ok("overflow", args + "--inject nan@step=5");
  const Metrics clean = dir.train_ok("clean", args);
  ASSERT_EQ(m.last.size(), 12u);
  EXPECT_EQ(m.last.at(5).at("skipped"), "fp16 gradient overflow: no update, loss scale lowered");
  EXPECT_EQ(m.last.at(5).at("loss_scale"), 1024.0);
  for (int64_t step = 6; step <= 12; ++step) {
    EXPECT_EQ(m.last.at(step).at("loss_scale"), 512.0) << step;
    EXPECT_FALSE(m.last.at(step).contains("skipped")) << step;
    EXPECT_TRUE(std::isfinite(m.losses.at(step))) << step;
    EXPECT_EQ(m.last.at(step).at("lr"), clean.last.at(step - 1).at("lr")) << step;
  }
  EXPECT_NE(clean.last.at(6).at("lr"), clean.last.at(5).at("lr"));  // the schedule moves here
  EXPECT_TRUE(std::isfinite(m.final_val_loss));
}

// The loss scaler's state (scale, growth and hysteresis trackers) is in state.json: with a window of
// 3 the scale doubles every 3 steps, and a run stopped at step 4 and resumed trains bit for bit like
// the uninterrupted one (planted: the state not restored on resume, so the scale restarts at 1024;
// caught by the losses).
TEST(Fp16Runs, ResumesBitwiseWithTheLossScale) {
  TinyRunDir run("llama-tiny");
  const std::string args = kFp16 + "--set precision.loss_scale_window=3 --set training.train_iters=8 "
                                   "--set logging.save_interval=0 ";
  const auto [straight, resumed] = megaton::testing::expect_resumes_bitwise(run, "fp16", args);
  EXPECT_EQ(straight.last.at(8).at("loss_scale"), 4096.0);  // doubled after steps 3 and 6
  EXPECT_EQ(resumed.last.at(8).at("loss_scale"), 4096.0);
}

TEST(Fp16Runs, BadSettingsAreRefusedNamingTheKey) {
  TinyRunDir dir;
  for (const auto& [set, key] : std::vector<std::pair<std::string, std::string>>{
           {"precision.fp16=true --set precision.bf16=true", "precision.fp16"},
           {"precision.fp16=true --set precision.fp8=hybrid", "precision.fp16"},
           {"precision.fp16=true --set precision.initial_loss_scale=0", "precision.initial_loss_scale"},
           {"precision.fp16=true --set precision.min_loss_scale=1e30", "precision.min_loss_scale"},
           {"precision.fp16=true --set precision.loss_scale_window=0", "precision.loss_scale_window"},
           {"precision.fp16=true --set precision.hysteresis=0", "precision.hysteresis"}}) {
    const CommandResult r = dir.train("bad", "--set " + set);
    EXPECT_NE(r.exit_code, 0) << set;
    EXPECT_NE(r.output.find(key), std::string::npos) << set << ": " << r.output;
  }
}
