// The state snapshot is both the rewind point and the source every checkpoint is written from,
// so its copies must hold every byte of the weights and AdamW moments: restored in memory, and
// written to a (one-rank) sharded checkpoint and loaded back. Checked per tensor and per byte, so that a single
// byte lost in a copy names its tensor (the end-to-end resume tests would only see other losses).
#include "megaton/train/state_snapshot.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../support/temp_dir.h"
#include "megaton/ckpt/sharded_checkpoint.h"
#include "megaton/models/hf_format.h"
#include "megaton/optim/adamw.h"

using namespace megaton;
using megaton::testing::TempDir;

namespace {

// Every weight and moment as (name, raw bytes), in a fixed order.
using StateBytes = std::vector<std::pair<std::string, std::string>>;

StateBytes state_bytes(const models::TransformerModel& model, const optim::AdamW& opt) {
  StateBytes out;
  auto add = [&](const std::string& name, const Tensor& t) {
    out.emplace_back(name, std::string(static_cast<const char*>(t.raw()), t.nbytes()));
  };
  for (const nn::Parameter* p : model.parameters()) add(p->name, p->value);
  for (const auto& [name, t] : opt.state_tensors()) add(name, t);
  return out;
}

::testing::AssertionResult same_state(const StateBytes& got, const StateBytes& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " tensors, expected " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    const auto& [name, bytes] = got[i];
    if (name != want[i].first)
      return ::testing::AssertionFailure() << "tensor " << i << " is " << name << ", expected " << want[i].first;
    if (bytes.size() != want[i].second.size())
      return ::testing::AssertionFailure()
             << name << ": " << bytes.size() << " bytes, expected " << want[i].second.size();
    for (size_t b = 0; b < bytes.size(); ++b)
      if (bytes[b] != want[i].second[b])
        return ::testing::AssertionFailure() << name << ": byte " << b << " of " << bytes.size() << " differs";
  }
  return ::testing::AssertionSuccess();
}

// One optimizer step on random gradients: moves every weight and moment.
void random_step(const models::TransformerModel& model, optim::AdamW& opt, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (nn::Parameter* p : model.parameters()) {
    float* g = p->grad.data<float>();
    for (int64_t i = 0; i < p->grad.numel(); ++i) g[i] = dist(rng);
  }
  opt.step(1e-2);
}

}  // namespace

TEST(StateSnapshot, RestoreAndCheckpointFilesGiveBackEveryByte) {
  TempDir dir;
  const auto cfg = train::load_train_config(
      "", {"model.preset=\"llama-tiny\"", "model.num_layers=2", "model.hidden_size=48", "model.num_attention_heads=6",
           "model.num_query_groups=2", "model.ffn_hidden_size=80", "training.seed=5"});
  models::TransformerModel model(cfg.model);
  model.init_weights(1);
  optim::AdamW opt(model.parameters(), optim::AdamWConfig{});
  std::mt19937 rng(3);
  random_step(model, opt, rng);

  // The buffers are reused by every capture: check the first one and a later one.
  train::StateSnapshot snap(model, opt);
  train::TrainProgress progress;
  for (int64_t capture = 1; capture <= 2; ++capture) {
    SCOPED_TRACE("capture " + std::to_string(capture));
    progress.step = opt.steps();
    progress.consumed_samples = 8 * progress.step;
    snap.capture(model, opt, progress, cfg);
    const StateBytes captured = state_bytes(model, opt);
    random_step(model, opt, rng);
    ASSERT_FALSE(same_state(state_bytes(model, opt), captured));  // so restoring has something to undo
    snap.restore(model, opt);
    EXPECT_TRUE(same_state(state_bytes(model, opt), captured));
    EXPECT_EQ(opt.steps(), progress.step);
    random_step(model, opt, rng);
    random_step(model, opt, rng);
  }

  // Files written from the second capture, loaded into a fresh model and optimizer.
  const std::string ckpt = dir.file("ckpt");
  std::filesystem::create_directories(ckpt);
  snap.write(ckpt, 0, {});
  ckpt::merge_shard_indexes(ckpt, 1, 10);
  models::TransformerModel loaded(cfg.model);
  optim::AdamW loaded_opt(loaded.parameters(), optim::AdamWConfig{});
  const train::TrainProgress back = train::load_checkpoint(ckpt, loaded, loaded_opt, cfg);
  snap.restore(model, opt);
  EXPECT_TRUE(same_state(state_bytes(loaded, loaded_opt), state_bytes(model, opt)));
  EXPECT_EQ(loaded_opt.steps(), progress.step);
  EXPECT_EQ(back.step, progress.step);
  EXPECT_EQ(back.consumed_samples, progress.consumed_samples);
}

// A checkpoint of the whole-model format older builds wrote (model.safetensors beside
// optimizer.safetensors, no metadata.json) is refused before it touches the model, naming the way
// to keep its weights.
TEST(StateSnapshot, WholeModelCheckpointsOfOlderBuildsAreRefused) {
  TempDir dir;
  const auto cfg = train::load_train_config(
      "", {"model.preset=\"llama-tiny\"", "model.num_layers=1", "model.hidden_size=48", "model.num_attention_heads=6",
           "model.num_query_groups=2", "model.ffn_hidden_size=80"});
  models::TransformerModel model(cfg.model);
  model.init_weights(1);
  const std::string ckpt = dir.file("ckpt");
  models::save_hf_model(model, ckpt);
  models::TransformerModel fresh(cfg.model);
  optim::AdamW opt(fresh.parameters(), optim::AdamWConfig{});
  const StateBytes before = state_bytes(fresh, opt);
  EXPECT_ERROR_CONTAINS(train::load_checkpoint(ckpt, fresh, opt, cfg), ckpt, "whole-model format", "model.load=" + ckpt);
  EXPECT_TRUE(same_state(state_bytes(fresh, opt), before));
}
