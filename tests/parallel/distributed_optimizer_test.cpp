// The distributed optimizer's pieces in one process: the sharded buffer layout (every bucket split
// into equal aligned shards that cover it once), AdamW over one rank's shard (bitwise the whole
// update restricted to it, and half the optimizer memory with two shards), and the layout-free
// state of a shard (loading the full state and saving it back give the owned elements).
// tests/train/distributed_optimizer_runs_test.cpp trains with it under mpirun.
#include "megaton/parallel/distributed_optimizer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>

#include "../support/tiny_model.h"
#include "megaton/core/allocator.h"
#include "megaton/models/transformer_model.h"
#include "megaton/nn/param_and_grad_buffer.h"
#include "megaton/optim/adamw.h"
#include "megaton/parallel/local_communicator.h"

using namespace megaton;

namespace {

// A tiny model (same seed every time) in a flat buffer of `shards` shards.
struct Buffered {
  std::unique_ptr<models::TransformerModel> model;
  std::unique_ptr<nn::ParamAndGradBuffer> buffer;
  Buffered(const std::string& preset, int64_t bucket_size, int64_t shards, int64_t expert_shards = 0) {
    model = std::make_unique<models::TransformerModel>(megaton::testing::tiny_config(preset));
    model->init_weights(11);
    buffer = std::make_unique<nn::ParamAndGradBuffer>(model->parameters(), bucket_size, shards, expert_shards);
  }
  // Deterministic gradients of every parameter for step `step` (the alignment gaps stay zero).
  void fill_grads(int step) const {
    uint32_t x = 12345u + 7919u * static_cast<uint32_t>(step);
    for (nn::Parameter* p : buffer->params()) {
      float* g = p->grad.data<float>();
      for (int64_t i = 0; i < p->grad.numel(); ++i) {
        x = x * 1664525u + 1013904223u;
        g[i] = (static_cast<float>(x >> 8) / 16777216.0f - 0.5f) * 0.02f;
      }
    }
  }
};

size_t optimizer_bytes() {
  return Allocator::host().stats().live[static_cast<size_t>(MemCategory::Optimizer)];
}

}  // namespace

// The MoE preset's routed experts sit in buckets of their own, split into another count of shards
// (the expert-data-parallel group's).
TEST(ShardedBuffer, BucketsSplitIntoEqualAlignedShardsThatCoverThemOnce) {
  for (const std::string preset : {"gpt-tiny", "llama-tiny", "mixtral-tiny"}) {
    for (int64_t shards : {1, 2, 3, 4}) {
      for (int64_t bucket_size : {int64_t{1000}, int64_t{40'000'000}}) {
        const int64_t expert_shards = preset == "mixtral-tiny" ? shards % 3 + 1 : 0;
        Buffered b(preset, bucket_size, shards, expert_shards);
        const nn::ParamAndGradBuffer& buf = *b.buffer;
        const std::string what = preset + " shards " + std::to_string(shards) + " bucket_size " +
                                 std::to_string(bucket_size) + " expert shards " + std::to_string(expert_shards);
        EXPECT_EQ(buf.shards(), shards);
        EXPECT_EQ(buf.expert_shards(), expert_shards ? expert_shards : shards);
        bool any_expert = false;
        ASSERT_FALSE(buf.buckets().empty());
        int64_t next = 0;
        std::vector<int64_t> covered(static_cast<size_t>(buf.weights().numel()), 0);
        for (size_t k = 0; k < buf.buckets().size(); ++k) {
          const nn::GradBucket& bucket = buf.buckets()[k];
          const int64_t n = bucket.expert ? buf.expert_shards() : shards;
          any_expert = any_expert || bucket.expert;
          EXPECT_EQ(buf.shards_of(k), n) << what << " bucket " << k;
          EXPECT_EQ(bucket.offset, next) << what << " bucket " << k;
          EXPECT_EQ(bucket.numel % (nn::ParamAndGradBuffer::kAlignElements * n), 0) << what << " bucket " << k;
          for (const nn::Parameter* p : bucket.params) {
            EXPECT_EQ(p->shard.group == nn::ParallelGroup::Expert, bucket.expert) << what << " " << p->name;
            EXPECT_GE(buf.offset_of(*p), bucket.offset) << what << " " << p->name;
            EXPECT_LE(buf.offset_of(*p) + p->value.numel(), bucket.offset + bucket.numel) << what << " " << p->name;
          }
          for (int64_t r = 0; r < n; ++r) {
            const nn::ElementRange s = buf.shard_range(k, r);
            EXPECT_EQ(s.numel * n, bucket.numel) << what;
            EXPECT_EQ(s.offset % nn::ParamAndGradBuffer::kAlignElements, 0) << what;  // 64 bytes of fp32
            EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.weights().data<float>() + s.offset) % 64, 0u) << what;
            // A rank's dense shard r and expert shard r (or shard 0 of buckets with fewer shards).
            EXPECT_EQ(buf.shard_ranges(bucket.expert ? 0 : r, bucket.expert ? r : 0).at(k), s) << what;
            for (int64_t i = s.offset; i < s.end(); ++i) ++covered[static_cast<size_t>(i)];
          }
          next = bucket.offset + bucket.numel;
        }
        EXPECT_EQ(next, buf.weights().numel()) << what;
        EXPECT_EQ(std::count(covered.begin(), covered.end(), 1), static_cast<long>(covered.size())) << what;
        EXPECT_EQ(buf.shard_ranges(0).size(), buf.buckets().size()) << what;
        EXPECT_EQ(any_expert, preset == "mixtral-tiny") << what;
      }
    }
  }
}

TEST(ShardedBuffer, OneShardKeepsTheUnshardedLayout) {
  Buffered plain("gpt-tiny", 1000, 1);
  Buffered sharded("gpt-tiny", 1000, 2);
  // One shard: every parameter at the next 64-byte boundary after the previous one, buckets ending
  // at the next parameter's start (the unsharded layout). Two: the same bucket cuts, each bucket
  // padded to a multiple of 32 elements instead of 16.
  int64_t end = 0;
  for (const nn::Parameter* p : plain.buffer->params()) {
    const int64_t aligned = (end + 15) / 16 * 16;
    EXPECT_EQ(plain.buffer->offset_of(*p), aligned) << p->name;
    end = aligned + p->value.numel();
  }
  EXPECT_EQ(plain.buffer->weights().numel(), (end + 15) / 16 * 16);
  ASSERT_EQ(plain.buffer->buckets().size(), sharded.buffer->buckets().size());
  int64_t padding = 0;
  for (size_t k = 0; k < plain.buffer->buckets().size(); ++k) {
    const auto& a = plain.buffer->buckets()[k];
    const auto& b = sharded.buffer->buckets()[k];
    ASSERT_EQ(a.params.size(), b.params.size()) << k;
    for (size_t i = 0; i < a.params.size(); ++i) EXPECT_EQ(a.params[i]->name, b.params[i]->name) << k;
    EXPECT_EQ(a.numel % nn::ParamAndGradBuffer::kAlignElements, 0);
    EXPECT_TRUE(b.numel == a.numel || b.numel == a.numel + nn::ParamAndGradBuffer::kAlignElements) << k;
    padding += b.numel - a.numel;
  }
  EXPECT_EQ(sharded.buffer->weights().numel(), plain.buffer->weights().numel() + padding);
  EXPECT_THROW(nn::ParamAndGradBuffer(plain.model->parameters(), 1000, 0), Error);
}

// Every rank's AdamW over its shard makes, there, exactly the update of the AdamW over the whole
// buffer: weights and both moments bitwise, over steps with weight decay, clipping and small
// buckets (so shards start and end inside parameters and inside weight-decay runs).
TEST(ShardedAdamW, ShardUpdateIsTheFullUpdateRestrictedToItBitwise) {
  for (int64_t shards : {2, 3}) {
    const optim::AdamWConfig cfg{1e-3, 0.9, 0.95, 1e-8, 0.1};
    Buffered full("llama-tiny", 1000, shards);
    optim::AdamW full_opt(*full.buffer, cfg);
    ASSERT_FALSE(full_opt.sharded());
    std::vector<std::unique_ptr<Buffered>> ranks;
    std::vector<std::unique_ptr<optim::AdamW>> opts;
    for (int64_t r = 0; r < shards; ++r) {
      ranks.push_back(std::make_unique<Buffered>("llama-tiny", 1000, shards));
      opts.push_back(std::make_unique<optim::AdamW>(*ranks.back()->buffer, cfg, ranks.back()->buffer->shard_ranges(r)));
      ASSERT_TRUE(opts.back()->sharded());
    }
    for (int step = 1; step <= 3; ++step) {
      full.fill_grads(step);
      full_opt.step(1e-3 * step, step == 2 ? 0.37 : 1.0);
      for (int64_t r = 0; r < shards; ++r) {
        ranks[r]->fill_grads(step);
        opts[r]->step(1e-3 * step, step == 2 ? 0.37 : 1.0);
      }
    }
    for (int64_t r = 0; r < shards; ++r) {
      const std::string what = "shard " + std::to_string(r) + " of " + std::to_string(shards);
      int64_t local = 0;
      for (const nn::ElementRange& s : opts[r]->owned()) {
        const size_t bytes = static_cast<size_t>(s.numel) * sizeof(float);
        EXPECT_EQ(std::memcmp(ranks[r]->buffer->weights().data<float>() + s.offset,
                              full.buffer->weights().data<float>() + s.offset, bytes), 0) << what << " weights at " << s.offset;
        EXPECT_EQ(std::memcmp(opts[r]->flat_exp_avg().data<float>() + local, full_opt.flat_exp_avg().data<float>() + s.offset,
                              bytes), 0) << what << " exp_avg at " << s.offset;
        EXPECT_EQ(std::memcmp(opts[r]->flat_exp_avg_sq().data<float>() + local,
                              full_opt.flat_exp_avg_sq().data<float>() + s.offset, bytes), 0)
            << what << " exp_avg_sq at " << s.offset;
        local += s.numel;
      }
      EXPECT_EQ(local * shards, full.buffer->weights().numel()) << what;
      // The elements it does not own were not touched: still the initial weights.
      Buffered fresh("llama-tiny", 1000, shards);
      for (int64_t other = 0; other < shards; ++other) {
        if (other == r) continue;
        for (const nn::ElementRange& s : ranks[r]->buffer->shard_ranges(other))
          EXPECT_EQ(std::memcmp(ranks[r]->buffer->weights().data<float>() + s.offset,
                                fresh.buffer->weights().data<float>() + s.offset, static_cast<size_t>(s.numel) * 4), 0)
              << what << " changed rank " << other << "'s elements at " << s.offset;
      }
    }
  }
}

// Two shards: each rank's moments take half the bytes of the whole optimizer's (on the same buffer
// layout), as the allocator's Optimizer counter shows.
TEST(ShardedAdamW, TwoShardsHoldHalfTheOptimizerMemory) {
  Buffered unsharded("gpt-tiny", 40'000'000, 1);
  Buffered b("gpt-tiny", 40'000'000, 2);
  const optim::AdamWConfig cfg{};
  size_t base = optimizer_bytes(), plain_bytes = 0, full_bytes = 0, shard_bytes[2] = {0, 0};
  {
    optim::AdamW opt(*unsharded.buffer, cfg);
    plain_bytes = optimizer_bytes() - base;
  }
  {
    optim::AdamW opt(*b.buffer, cfg);
    full_bytes = optimizer_bytes() - base;
  }
  for (int r = 0; r < 2; ++r) {
    optim::AdamW opt(*b.buffer, cfg, b.buffer->shard_ranges(r));
    shard_bytes[r] = optimizer_bytes() - base;
  }
  EXPECT_EQ(optimizer_bytes(), base);
  EXPECT_EQ(plain_bytes, 2 * sizeof(float) * static_cast<size_t>(unsharded.buffer->weights().numel()));
  EXPECT_EQ(full_bytes, 2 * sizeof(float) * static_cast<size_t>(b.buffer->weights().numel()));
  EXPECT_EQ(shard_bytes[0], shard_bytes[1]);
  EXPECT_EQ(2 * shard_bytes[0], full_bytes);
  // Against the plain (unsharded-layout) optimizer: half, plus at most 16 padding floats per bucket.
  EXPECT_LE(2 * shard_bytes[0], plain_bytes + 2 * sizeof(float) * 16 * b.buffer->buckets().size());
  std::printf("optimizer bytes: dp1 %zu, dp2 per rank %zu (%ld parameters, %ld buffer elements with 2 shards)\n",
              plain_bytes, shard_bytes[0], static_cast<long>(nn::count_parameters(b.model->parameters())),
              static_cast<long>(b.buffer->weights().numel()));
}

// A shard's state is layout-free: loading the full state of a whole-buffer AdamW gives the shard
// its owned elements; saving writes exactly those into full tensors. With a group of one, the
// distributed optimizer saves and loads the full state like plain AdamW.
TEST(ShardedAdamW, ShardLoadsAndSavesItsElementsOfTheFullState) {
  const optim::AdamWConfig cfg{};
  Buffered full("gpt-tiny", 1000, 2);
  optim::AdamW full_opt(*full.buffer, cfg);
  for (int step = 1; step <= 2; ++step) {
    full.fill_grads(step);
    full_opt.step(1e-2);
  }
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : full_opt.state_tensors()) state[name] = t.clone(MemCategory::Other);
  Buffered shard("gpt-tiny", 1000, 2);
  optim::AdamW shard_opt(*shard.buffer, cfg, shard.buffer->shard_ranges(1));
  EXPECT_THROW(shard_opt.state_tensors(), Error);
  shard_opt.load_state(state, 2);
  EXPECT_EQ(shard_opt.steps(), 2);
  int64_t local = 0;
  for (const nn::ElementRange& s : shard_opt.owned()) {
    EXPECT_EQ(std::memcmp(shard_opt.flat_exp_avg().data<float>() + local, full_opt.flat_exp_avg().data<float>() + s.offset,
                          static_cast<size_t>(s.numel) * 4), 0) << s.offset;
    local += s.numel;
  }
  // Saving: zeroed full tensors get the owned elements, the others stay zero.
  std::vector<std::pair<std::string, Tensor>> into;
  for (const auto& spec : shard_opt.state_specs())
    into.emplace_back(spec.name, Tensor::zeros(spec.shape, DType::F32, MemCategory::Other, spec.name));
  shard_opt.save_state(into);
  const auto owned = shard_opt.owned();
  for (size_t i = 0; i < shard.buffer->params().size(); ++i) {
    const nn::Parameter* p = shard.buffer->params()[i];
    const int64_t off = shard.buffer->offset_of(*p);
    const float* got = into[2 * i].second.data<float>();
    const float* want = state.at(p->name + ".exp_avg").data<float>();
    for (int64_t j = 0; j < p->value.numel(); ++j) {
      const bool mine = std::any_of(owned.begin(), owned.end(), [&](const nn::ElementRange& r) {
        return off + j >= r.offset && off + j < r.end();
      });
      ASSERT_EQ(got[j], mine ? want[j] : 0.0f) << p->name << "[" << j << "]";
    }
  }
  // The distributed optimizer over a group of one: full state in, the same full state out.
  parallel::LocalCommunicator one("dp");
  Buffered single("gpt-tiny", 1000, 1);
  parallel::DistributedOptimizer dist(*single.buffer, cfg, one);
  dist.load_state(state, 2);
  std::vector<std::pair<std::string, Tensor>> back;
  for (const auto& spec : dist.state_specs())
    back.emplace_back(spec.name, Tensor::zeros(spec.shape, DType::F32, MemCategory::Other, spec.name));
  dist.save_state(back);
  for (const auto& [name, t] : back)
    EXPECT_EQ(std::memcmp(t.raw(), state.at(name).raw(), t.nbytes()), 0) << name;
  // A buffer with the wrong number of shards for the group is refused.
  EXPECT_THROW(parallel::DistributedOptimizer(*full.buffer, cfg, one), Error);
}
