#include "megaton/infer/token_logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace megaton::infer {

GeneratedToken score_token(const float* logits, int64_t vocab, int32_t id, int64_t top_n) {
  GeneratedToken t(id);
  if (top_n < 0) return t;
  const double top = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(logits[v]) - top);
  const double log_z = top + std::log(sum);
  const auto logprob = [&](int32_t v) { return static_cast<float>(static_cast<double>(logits[v]) - log_z); };
  t.logprob = logprob(id);
  const int64_t n = std::min(top_n, vocab);
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  for (int64_t i = 0; i < n; ++i) t.top.push_back({ids[static_cast<size_t>(i)], logprob(ids[static_cast<size_t>(i)])});
  return t;
}

}  // namespace megaton::infer
