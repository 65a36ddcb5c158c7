// What generation hands out per token: its id and, when asked (SamplingOptions::logprobs), its
// log-probability and the most likely alternatives, as OpenAI's `logprobs` reports them.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

namespace megaton::infer {

// Most alternatives a request may ask for per token (OpenAI's top_logprobs limit).
inline constexpr int64_t kMaxTopLogprobs = 20;

struct TokenLogprob {
  int32_t id;
  float logprob;
};

struct GeneratedToken {
  explicit GeneratedToken(int32_t token) : id(token) {}
  int32_t id;
  // Filled when logprobs were asked for: log-softmax of the logits the sampler saw (after the
  // penalties, over the ids it may draw) at temperature 1, untruncated by top-k / top-p / min-p, as
  // vLLM reports them; `top` the n most likely ids, most likely first (ties: lower id first).
  float logprob = 0;
  std::vector<TokenLogprob> top;
};

// Sees each new token and returns whether to go on.
using TokenCallback = std::function<bool(const GeneratedToken&)>;

// `id` scored against one row of `vocab` logits, with the `top_n` most likely ids; top_n < 0: the
// id alone, nothing computed. Sums in double: a 150k-id vocabulary loses nothing to float rounding.
GeneratedToken score_token(const float* logits, int64_t vocab, int32_t id, int64_t top_n);

}  // namespace megaton::infer
