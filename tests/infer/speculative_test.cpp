// Self-speculative greedy decoding with the MTP draft (infer/speculative.h) returns exactly the tokens
// of plain greedy decoding, through both the accepted and the rejected branch, in f32 and bf16.
#include "megaton/infer/speculative.h"

#include <gtest/gtest.h>

#include <cmath>

#include "../support/tiny_model.h"

using namespace megaton;

namespace {

// A tiny DeepSeek-V3 with one MTP depth. With `echo`, the depth passes the main model's hidden state
// through (its block adds nothing, eh_proj selects hnorm(h)), so it drafts the main model's own
// prediction for the position before: accepted exactly where the greedy text repeats a token.
std::unique_ptr<models::TransformerModel> model(bool echo, DType dtype) {
  auto c = megaton::testing::tiny_config("deepseek-v3-tiny");
  c.init_method_std = 0.2;
  auto m = std::make_unique<models::TransformerModel>(c);
  m->init_weights(17);
  if (echo) {
    nn::MtpLayer& d = *m->mtp_layers().front();
    nn::ParameterList block;
    d.block.parameters(block);
    for (nn::Parameter* p : block)
      if (p->name.ends_with("linear_proj.weight") || p->name.ends_with("linear_fc2.weight"))
        p->value.zero_();
    const int64_t C = c.hidden_size;
    float* w = d.eh_proj.weight.value.data<float>();  // [C, 2C]: the identity on the hidden half
    for (int64_t i = 0; i < C * 2 * C; ++i) w[i] = 0.0f;
    for (int64_t i = 0; i < C; ++i) w[i * 2 * C + C + i] = 1.0f;
  }
  m->set_compute_dtype(dtype);
  return m;
}

infer::SamplingOptions greedy(int64_t n) {
  infer::SamplingOptions o;
  o.temperature = 0;
  o.max_new_tokens = n;
  return o;
}

}  // namespace

TEST(SpeculativeDecoding, ReturnsTheTokensOfGreedyDecodingWhetherDraftsAreAcceptedOrNot) {
  for (DType dtype : {DType::F32, DType::BF16})
    for (bool echo : {false, true}) {
      auto m = model(echo, dtype);
      const std::vector<int32_t> prompt = {72, 101, 108, 108, 111};
      const auto want = infer::generate(*m, prompt, greedy(40));
      infer::SpeculativeStats spec;
      infer::GenerateStats stats;
      const auto got = infer::generate_speculative(*m, prompt, greedy(40), {}, &stats, &spec);
      EXPECT_EQ(got, want) << dtype_name(dtype) << (echo ? " echo draft" : " random draft");
      EXPECT_EQ(stats.prefill_tokens, static_cast<int64_t>(prompt.size()));
      EXPECT_EQ(stats.decode_tokens, static_cast<int64_t>(got.size()) - 1);
      EXPECT_EQ(spec.main_steps, spec.drafted);
      // The prefill's token, then one per step and one more per accepted draft (the last step's second
      // token may fall past the budget).
      const int64_t emitted = 1 + spec.drafted + spec.accepted, n = static_cast<int64_t>(got.size());
      EXPECT_TRUE(n == emitted || n == emitted - 1) << n << " tokens from " << spec.drafted << " steps";
      if (echo) {
        EXPECT_GT(spec.accepted, 0) << "the echo draft was never accepted: the accepted branch went untested";
        EXPECT_LT(spec.accepted, spec.drafted) << "every draft was accepted: the rejected branch went untested";
      }
    }
}

TEST(SpeculativeDecoding, StopsAtTheStopTokenAndRefusesWhatItCannotDo) {
  auto m = model(true, DType::F32);
  const std::vector<int32_t> prompt = {72, 101};
  auto o = greedy(30);
  const auto plain = infer::generate(*m, prompt, o);
  ASSERT_GT(plain.size(), 3u);
  o.stop_token = plain[2];
  EXPECT_EQ(infer::generate_speculative(*m, prompt, o), infer::generate(*m, prompt, o));
  o.temperature = 0.7;
  EXPECT_THROW(infer::generate_speculative(*m, prompt, o), Error);
  models::TransformerModel dense(megaton::testing::tiny_config("llama-tiny"));
  EXPECT_THROW(infer::generate_speculative(dense, prompt, greedy(4)), Error);
}

// A separate draft model (generate_with_draft): plain greedy's tokens whether it is the main model
// itself (every proposal accepted, k + 1 tokens a step), a different random model (most rejected) or
// an MLA model drafting for a Llama; every budget from 1 token up, so rounds end mid-proposal.
namespace {
std::unique_ptr<models::TransformerModel> llama(uint64_t seed, int64_t layers, DType dtype) {
  auto c = megaton::testing::tiny_config("llama-tiny");
  c.init_method_std = 0.2;
  c.num_layers = layers;
  auto m = std::make_unique<models::TransformerModel>(c);
  m->init_weights(seed);
  m->set_compute_dtype(dtype);
  return m;
}
}  // namespace

TEST(DraftModelDecoding, ReturnsTheTokensOfGreedyDecodingWithAnyDraft) {
  const std::vector<int32_t> prompt = {72, 101, 108, 108, 111};
  for (DType dtype : {DType::F32, DType::BF16}) {
    auto main = llama(5, 2, dtype), self = llama(5, 2, dtype), other = llama(9, 1, dtype);
    for (const int64_t k : {1, 3, 4}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + ", " + std::to_string(k) + " draft tokens");
      const auto want = infer::generate(*main, prompt, greedy(40));
      infer::SpeculativeStats spec;
      infer::GenerateStats stats;
      EXPECT_EQ(infer::generate_with_draft(*main, *self, prompt, greedy(40), k, {}, &stats, &spec), want);
      EXPECT_EQ(spec.accepted, spec.drafted) << "the main model as its own draft: every proposal holds";
      EXPECT_LE(spec.main_steps, (39 + k) / (k + 1) + 1);
      EXPECT_EQ(stats.decode_tokens, 39);
      EXPECT_EQ(infer::generate_with_draft(*main, *other, prompt, greedy(40), k, {}, nullptr, &spec), want);
      EXPECT_LT(spec.accepted, spec.drafted) << "a different model's proposals were all accepted";
      for (int64_t n = 1; n <= 6; ++n)
        EXPECT_EQ(infer::generate_with_draft(*main, *other, prompt, greedy(n), k), infer::generate(*main, prompt, greedy(n)))
            << n << " new tokens";
    }
  }
}

TEST(DraftModelDecoding, StopsAndRefusesWhatItCannotDo) {
  auto main = llama(5, 2, DType::F32), draft = llama(9, 1, DType::F32);
  const std::vector<int32_t> prompt = {72, 101};
  auto o = greedy(30);
  const auto plain = infer::generate(*main, prompt, o);
  ASSERT_GT(plain.size(), 3u);
  o.stop_token = plain[2];
  EXPECT_EQ(infer::generate_with_draft(*main, *main, prompt, o, 4), infer::generate(*main, prompt, o));
  // Near the end of the context: proposals are cut to the positions left.
  const std::vector<int32_t> late(static_cast<size_t>(main->config().max_position_embeddings - 3), 65);
  EXPECT_EQ(infer::generate_with_draft(*main, *draft, late, greedy(10), 4), infer::generate(*main, late, greedy(10)));
  o.temperature = 0.7;
  EXPECT_THROW(infer::generate_with_draft(*main, *draft, prompt, o, 4), Error);
  EXPECT_THROW(infer::generate_with_draft(*main, *draft, prompt, greedy(4), 0), Error);
  auto c = megaton::testing::tiny_config("llama-tiny");
  c.vocab_size = 300;
  models::TransformerModel wide(c);
  EXPECT_THROW(infer::generate_with_draft(*main, wide, prompt, greedy(4), 4), Error);
  // An MLA model drafting for a Llama of the same vocabulary.
  auto mla = model(false, DType::F32);
  ASSERT_EQ(mla->config().vocab_size, main->config().vocab_size);
  EXPECT_EQ(infer::generate_with_draft(*main, *mla, prompt, greedy(20), 3), infer::generate(*main, prompt, greedy(20)));
}

// Logprobs through speculative decoding: each emitted token is scored on the main model's logits row
// it was chosen from, so the MTP and draft-model paths report plain greedy's logprobs and top ids (to
// the rounding of verifying several rows at once), through accepted and rejected drafts alike.
// Planted: the accepted token scored on the row before it, caught.
TEST(SpeculativeDecoding, LogprobsAreThoseOfPlainGreedyDecoding) {
  const std::vector<int32_t> prompt = {72, 101, 108, 108, 111};
  auto o = greedy(30);
  o.logprobs = 3;
  const auto collect = [](std::vector<infer::GeneratedToken>& into) {
    return [&into](const infer::GeneratedToken& t) {
      into.push_back(t);
      return true;
    };
  };
  const auto expect_same = [](const std::vector<infer::GeneratedToken>& got,
                              const std::vector<infer::GeneratedToken>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE("token " + std::to_string(i));
      EXPECT_EQ(got[i].id, want[i].id);
      EXPECT_TRUE(std::isfinite(got[i].logprob));
      EXPECT_NEAR(got[i].logprob, want[i].logprob, 1e-4);
      ASSERT_EQ(got[i].top.size(), 3u);
      for (size_t j = 0; j < 3; ++j) {
        EXPECT_EQ(got[i].top[j].id, want[i].top[j].id);
        EXPECT_NEAR(got[i].top[j].logprob, want[i].top[j].logprob, 1e-4);
      }
    }
  };
  auto mtp = model(true, DType::F32);
  std::vector<infer::GeneratedToken> want, got;
  infer::generate(*mtp, prompt, o, collect(want));
  infer::SpeculativeStats spec;
  infer::generate_speculative(*mtp, prompt, o, collect(got), nullptr, &spec);
  ASSERT_GT(spec.accepted, 0);
  expect_same(got, want);
  auto main = llama(5, 2, DType::F32), other = llama(9, 1, DType::F32);
  want.clear();
  infer::generate(*main, prompt, o, collect(want));
  for (models::TransformerModel* draft : {main.get(), other.get()}) {  // proposals accepted, mostly rejected
    got.clear();
    infer::generate_with_draft(*main, *draft, prompt, o, 3, collect(got));
    expect_same(got, want);
  }
}
