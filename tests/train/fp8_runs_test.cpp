// FP8 training end to end (`[precision] fp8`): gpt-tiny and llama-tiny train under every recipe to
// a validation loss close to the fp32 run's; delayed scaling agrees with one process at dp2, tp2 and
// pp2; a bad recipe or format is refused up front naming the key.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "tiny_run.h"

using megaton::testing::Metrics;
using megaton::testing::TinyRunDir;
using megaton::testing::CommandResult;
using megaton::Tensor;

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

// Delayed scaling has no scales before its first amaxes, so its first step calibrates: the linears
// run in the compute precision (fp32, or bf16 as Megatron's FP8 runs do) and record amaxes, so that
// step is bit for bit the run without FP8; the second quantises. (Planted: quantising at scale 1 in
// step 1, as TransformerEngine starts, makes step 1 differ.)
TEST(Fp8Runs, DelayedScalingCalibratesInItsFirstStep) {
  TinyRunDir run("gpt-tiny");
  const std::string fp8 = "--set precision.fp8=hybrid --set precision.fp8_recipe=delayed ";
  for (const std::string compute : {"f32", "bf16"}) {
    for (int steps : {1, 2}) {
      const std::string n = compute + "_" + std::to_string(steps);
      SCOPED_TRACE(n);
      const std::string args = "--set training.train_iters=" + std::to_string(steps) +
                               " --set optimizer.lr_warmup_iters=0 --set optimizer.lr_decay_iters=10 --set "
                               "logging.save_interval=0 " + (compute == "bf16" ? "--set precision.bf16=true " : "");
      const Metrics a = run.train_ok("plain_" + n, args), b = run.train_ok("fp8_" + n, args + fp8);
      ASSERT_FALSE(a.losses.empty());
      ASSERT_EQ(a.losses.size(), b.losses.size());
      EXPECT_EQ(a.losses.begin()->second, b.losses.begin()->second);  // step 1's loss, unquantised in both
      const auto wa = megaton::testing::final_weights(run.run_dir("plain_" + n));
      const auto wb = megaton::testing::final_weights(run.run_dir("fp8_" + n));
      if (steps == 1) {
        megaton::testing::expect_bitwise_equal(wa, wb);
      } else {
        size_t differ = 0;
        for (const auto& [name, t] : wa) differ += std::memcmp(t.raw(), wb.at(name).raw(), t.nbytes()) != 0;
        EXPECT_GT(differ, 0u) << "step 2 did not quantise";
      }
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
           {"precision.fp8=hybrid --set precision.fp8_amax_compute_algo=mean", "precision.fp8_amax_compute_algo"},
           {"precision.fp8=hybrid --set precision.first_last_layers_bf16=true --set precision.num_layers_at_start_in_bf16=3",
            "precision.num_layers_at_start_in_bf16"},
           {"precision.fp8=hybrid --set precision.first_last_layers_bf16=true --set precision.num_layers_at_end_in_bf16=-1",
            "precision.num_layers_at_end_in_bf16"},
           {"precision.fp8=hybrid --set precision.first_last_layers_bf16=true", "precision.first_last_layers_bf16"}}) {
    const CommandResult r = dir.train("bad", "--set " + set);
    EXPECT_NE(r.exit_code, 0) << set;
    EXPECT_NE(r.output.find(key), std::string::npos) << set << ": " << r.output;
  }
}

// Delayed scaling under parallelism: every rank must quantise with the scales one process would
// use, so the amaxes are max-reduced over the data- and tensor-parallel groups (a layer lives on one
// pipeline stage, whose histories are its own). Step 2 is the first to quantise
// with scales from reduced amaxes, before FP8 code flips amplify the layouts' rounding: at dp2 and
// pp2 it matches one process to 1e-7 (measured ~2e-9 relative; 3e-5 with the dp reduction removed).
// tp2's split forward already flips codes at step 2 (~2e-6 either way), so this run cannot tell its
// reduction's absence; every layout stays within 1e-4 of one process at every step.
TEST(Fp8Runs, DelayedScalingAgreesAcrossParallelLayouts) {
  TinyRunDir run("gpt-tiny");
  const std::string fp8 =
      "--set precision.fp8=hybrid --set precision.fp8_recipe=delayed --set training.train_iters=8 "
      "--set logging.save_interval=0 --set training.threads=1 --set model.num_layers=4 --set training.micro_batch_size=2 ";
  const Metrics single = run.train_ok("single", fp8);
  for (const megaton::testing::MpiVariant& v : std::vector<megaton::testing::MpiVariant>{
           {"dp2", 2, "", "data parallel 2 ranks"},
           {"tp2", 2, "--set tp=2", "tensor parallel 2 ranks"},
           {"pp2", 2, "--set pp=2", "pipeline parallel 2 stages"}}) {
    const Metrics got = run.train_mpi_ok(v.np, v.name, fp8 + v.args, v.banner);
    ASSERT_EQ(got.losses.size(), single.losses.size()) << v.name;
    for (const auto& [step, loss] : single.losses) {
      ASSERT_TRUE(got.losses.count(step)) << v.name << " step " << step;
      EXPECT_NEAR(got.losses.at(step), loss, (step == 2 && v.name != "tp2" ? 1e-7 : 1e-4) * std::abs(loss)) << v.name << " step " << step;
    }
  }
}

// The delayed-scaling scales and amax histories are checkpointed ("fp8/" tensors): a run
// stopped at step 4 and resumed trains bit for bit like the uninterrupted one (planted: the state
// not loaded on resume, so the histories restart; the losses after step 4 then differ).
TEST(Fp8Runs, DelayedScalingResumesBitwise) {
  TinyRunDir run("llama-tiny");
  const std::string fp8 =
      "--set precision.fp8=hybrid --set precision.fp8_recipe=delayed --set precision.fp8_amax_history_len=4 "
      "--set precision.fp8_amax_compute_algo=max --set training.train_iters=8 --set logging.save_interval=0 ";
  megaton::testing::expect_resumes_bitwise(run, "pp1", fp8);
  // At pp2 each stage holds its layers' states and writes them in its shard; each stage resumes
  // its own, bit for bit.
  megaton::testing::expect_resumes_bitwise(run, "pp2", fp8 + "--set pp=2 ", 2, "pipeline parallel 2");
  // Resuming with another history length is refused naming the checkpoint and the key.
  EXPECT_EQ(run.train_ok("other_len", fp8 + "--set training.exit_interval=4").losses.size(), 4u);
  const CommandResult r = run.train("other_len", fp8 + "--set precision.fp8_amax_history_len=2 --resume auto");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("checkpoints/step_000004: FP8 state 'fp8/"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fp8_amax_history_len"), std::string::npos) << r.output;
}
