// A diverged run is a failed run (issue 8, principle 3): a non-finite loss that cannot be rewound
// stops the run with a non-zero exit before its update; weights that are not finite are never
// written over good checkpoints or a good final model; `megaton eval` of a model whose loss is not
// finite fails. Hyper-parameters that can only train NaN are refused up front (bad_input_test).
#include <gtest/gtest.h>

#include "megaton/ckpt/checkpoint_dir.h"
#include "megaton/ckpt/manifest.h"
#include "tiny_run.h"

using namespace megaton;
using namespace megaton::testing;
namespace fs = std::filesystem;

namespace {

const std::string kShort = "--set training.train_iters=10 --set logging.save_interval=2 ";

}  // namespace

// A NaN at step 7 without rewind: the run stops there, non-zero, naming the step and the newest good
// checkpoint (step 6, complete and valid); no final model.
TEST(Divergence, ANonFiniteLossWithoutRewindStopsTheRunAndKeepsTheLastGoodCheckpoint) {
  TinyRunDir d;
  const CommandResult r = d.train("nan", kShort + "--inject nan@step=7");
  EXPECT_NE(r.exit_code, 0);
  const std::string run = d.run_dir("nan");
  EXPECT_NE(r.output.find("error: step 7: loss is nan: the run diverged and cannot rewind (config key "
                          "'rewind.enabled' is false); stopping before the update; the newest checkpoint is " +
                          run + "/checkpoints/step_000006"),
            std::string::npos)
      << r.output;
  const Metrics m = read_metrics(run);
  EXPECT_EQ(m.losses.size(), 6u);
  ASSERT_EQ(m.events_of("diverged").size(), 1u);
  EXPECT_EQ(m.events_of("diverged")[0]["step"], 7);
  EXPECT_EQ(ckpt::list_checkpoints(run + "/checkpoints").front(), run + "/checkpoints/step_000006");
  EXPECT_NO_THROW(ckpt::verify_manifest(run + "/checkpoints/step_000006"));
  EXPECT_FALSE(fs::exists(run + "/final"));
  EXPECT_EQ(r.output.find("final validation loss"), std::string::npos) << r.output;
}

// Extending a finished run that then diverges leaves its final model and checkpoints as they were.
TEST(Divergence, AnExtendedRunThatDivergesLeavesTheFinishedRunsResults) {
  TinyRunDir d;
  const std::string run = d.run_dir("run");
  ASSERT_EQ(d.train("run", kShort).exit_code, 0);
  const std::string final_model = read_bytes(run + "/final/model.safetensors");
  const CommandResult r = d.train("run", kShort + "--resume auto --set training.train_iters=14 --inject nan@step=13");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("step 13: loss is nan: the run diverged"), std::string::npos) << r.output;
  EXPECT_EQ(read_bytes(run + "/final/model.safetensors"), final_model);
  EXPECT_EQ(ckpt::list_checkpoints(run + "/checkpoints").front(), run + "/checkpoints/step_000012");
}

// lr = 1e39 is finite in the config but infinite in the fp32 update: step 1's weights are NaN while
// its loss and gradients were fine. The step-1 checkpoint is refused, so no NaN checkpoint exists
// (with keep_last it would have replaced the good ones), nor a final model.
TEST(Divergence, NonFiniteWeightsAreNeverSaved) {
  TinyRunDir d;
  const CommandResult r = d.train("huge_lr", "--set optimizer.lr=1e39 --set optimizer.min_lr=0.0 "
                                             "--set logging.save_interval=1 --set training.train_iters=6");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("error: step 1: the weights are not finite; not writing a checkpoint (it would replace "
                          "good files); no checkpoint was written yet"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(ckpt::list_checkpoints(d.run_dir("huge_lr") + "/checkpoints").empty());
  EXPECT_FALSE(fs::exists(d.run_dir("huge_lr") + "/final"));
}

// eval of a model whose loss is NaN (a NaN weight) or Inf (finite weights so large the logits
// overflow) exits non-zero naming the model, instead of printing {"loss": null}.
TEST(Divergence, EvalOfAModelWithANonFiniteLossFails) {
  TinyRunDir d;
  ASSERT_EQ(d.train("run", "--set training.train_iters=6 --set logging.save_interval=0").exit_code, 0);
  const std::string good = d.run_dir("run") + "/final";
  const std::string eval = std::string(MEGATON_BINARY) + " eval --data " + d.run_dir("valid") + " --seq-len 16 --max-samples 8 --model ";
  CommandResult r = run_command(eval + good);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const auto& [name, scale] : std::vector<std::pair<std::string, float>>{{"nan", NAN}, {"huge", 1e30f}}) {
    const std::string bad = d.run_dir(name);
    fs::copy(good, bad);
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (auto& [tensor_name, t] : ckpt::load_safetensors(bad + "/model.safetensors")) {
      float* v = t.data<float>();
      for (int64_t i = 0; i < t.numel(); ++i) v[i] = std::isnan(scale) ? (i == 0 ? scale : v[i]) : v[i] * scale;
      tensors.emplace_back(tensor_name, t);
    }
    ckpt::save_safetensors(bad + "/model.safetensors", tensors, {{"format", "pt"}});
    r = run_command(eval + bad);
    EXPECT_NE(r.exit_code, 0) << name << ": " << r.output;
    EXPECT_NE(r.output.find("error: model '" + bad + "' gives a non-finite loss"), std::string::npos) << r.output;
  }
}
