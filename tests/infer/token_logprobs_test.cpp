// score_token: log-softmax of one row of logits and its most likely ids (planted: the log-partition
// summed without the max shifted out, overflowing to inf on logits of 1000: caught).
#include "megaton/infer/token_logprobs.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

using namespace megaton::infer;

TEST(TokenLogprobs, LogSoftmaxOfTheRowAndTheMostLikelyIdsInOrder) {
  // Ties (ids 1 and 3) go to the lower id; large logits must not overflow the partition sum.
  const std::vector<float> logits = {1000.0f, 1002.0f, 999.0f, 1002.0f, -std::numeric_limits<float>::infinity()};
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l) - 1002.0);
  const auto want = [&](int v) { return static_cast<double>(logits[v]) - 1002.0 - std::log(z); };
  const GeneratedToken t = score_token(logits.data(), 5, 2, 3);
  EXPECT_EQ(t.id, 2);
  EXPECT_NEAR(t.logprob, want(2), 1e-6);
  ASSERT_EQ(t.top.size(), 3u);
  const int order[] = {1, 3, 0};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(t.top[i].id, order[i]);
    EXPECT_NEAR(t.top[i].logprob, want(order[i]), 1e-6);
  }
  // Probabilities sum to 1; a masked id has probability 0.
  EXPECT_NEAR(std::exp(want(0)) + std::exp(want(1)) + std::exp(want(2)) + std::exp(want(3)), 1.0, 1e-12);
  EXPECT_EQ(score_token(logits.data(), 5, 4, 0).logprob, -std::numeric_limits<float>::infinity());
  // More alternatives than ids: all of them; none asked: nothing computed.
  EXPECT_EQ(score_token(logits.data(), 5, 0, 20).top.size(), 5u);
  const GeneratedToken bare = score_token(logits.data(), 5, 0, -1);
  EXPECT_EQ(bare.logprob, 0.0f);
  EXPECT_TRUE(bare.top.empty());
}
