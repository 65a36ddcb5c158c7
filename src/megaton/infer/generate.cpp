#include "megaton/infer/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "megaton/core/rng.h"

namespace megaton::infer {

int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& opts, uint64_t draw) {
  if (opts.temperature <= 0) return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  // Candidates sorted by logit, cut by top-k, then softmax at the temperature and top-p.
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t k = opts.top_k > 0 ? std::min(opts.top_k, vocab) : vocab;
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), by_logit);
  ids.resize(static_cast<size_t>(k));
  std::vector<double> p(ids.size());
  const double top = logits[ids[0]];
  double sum = 0;
  for (size_t i = 0; i < ids.size(); ++i) sum += p[i] = std::exp((logits[ids[i]] - top) / opts.temperature);
  size_t keep = ids.size();
  if (opts.min_p > 0) {  // p[0] is the largest (sorted by logit)
    while (keep > 1 && p[keep - 1] < opts.min_p * p[0]) --keep;
  }
  if (opts.top_p < 1.0) {
    double cum = 0;
    for (size_t i = 0; i < keep; ++i) {
      cum += p[i] / sum;
      if (cum >= opts.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  const double total = std::accumulate(p.begin(), p.begin() + static_cast<int64_t>(keep), 0.0);
  const double u = Philox(opts.seed, 0x5a3b1e).uniform_double(draw) * total;
  double cum = 0;
  for (size_t i = 0; i < keep; ++i) {
    cum += p[i];
    if (u <= cum) return ids[i];
  }
  return ids[keep - 1];
}

TokenHistory::TokenHistory(const SamplingOptions& opts, int64_t vocab, const std::vector<int32_t>& prompt)
    : repetition_(opts.repetition_penalty), presence_(opts.presence_penalty), frequency_(opts.frequency_penalty) {
  if (repetition_ == 1.0 && presence_ == 0.0 && frequency_ == 0.0) return;
  seen_.assign(static_cast<size_t>(vocab), 0);
  generated_.assign(static_cast<size_t>(vocab), 0);
  for (int32_t id : prompt) see(id);
}

void TokenHistory::see(int32_t id) {
  const auto i = static_cast<size_t>(id);
  if (i >= seen_.size() || seen_[i]) return;
  seen_[i] = 1;
  ids_.push_back(id);
}

void TokenHistory::add_generated(int32_t id) {
  if (seen_.empty()) return;  // no penalty
  see(id);
  ++generated_[static_cast<size_t>(id)];
}

void TokenHistory::penalize(float* logits) const {
  for (int32_t id : ids_) {  // only ids seen can be penalized: a sparse pass
    const auto i = static_cast<size_t>(id);
    double l = logits[i];
    if (repetition_ != 1.0) l = l > 0 ? l / repetition_ : l * repetition_;
    if (generated_[i] > 0) l -= presence_ + frequency_ * static_cast<double>(generated_[i]);
    logits[i] = static_cast<float>(l);
  }
}

void check_sampling(const SamplingOptions& opts, const char* who) {
  if (!(opts.repetition_penalty > 0) || !(opts.min_p >= 0 && opts.min_p <= 1))
    fail(who, ": repetition_penalty must be > 0 and min_p in [0, 1]");
  if (opts.logprobs < -1 || opts.logprobs > kMaxTopLogprobs)
    fail(who, ": logprobs ", opts.logprobs, " outside -1 (none) .. ", kMaxTopLogprobs);
}

std::vector<int32_t> generate(models::TransformerModel& model, const std::vector<int32_t>& prompt,
                              const SamplingOptions& opts, const TokenCallback& on_token, GenerateStats* stats) {
  if (prompt.empty()) fail("generate: the prompt encodes to no tokens");
  check_sampling(opts, "generate");
  const int64_t max_len = model.config().max_position_embeddings;
  const int64_t total = std::min<int64_t>(static_cast<int64_t>(prompt.size()) + opts.max_new_tokens, max_len);
  if (static_cast<int64_t>(prompt.size()) >= max_len)
    fail("generate: prompt of ", prompt.size(), " tokens leaves no room in the model's ", max_len, " positions");
  model.refresh_compute_weights();
  auto caches = model.new_kv_caches(1, total);
  const int64_t V = opts.vocab_size > 0 ? std::min(opts.vocab_size, model.config().vocab_size) : model.config().vocab_size;
  std::vector<int32_t> out;
  TokenHistory history(opts, model.config().vocab_size, prompt);
  Tensor input = Tensor::empty({1, static_cast<int64_t>(prompt.size())}, DType::I32, MemCategory::Activations,
                               "prompt");
  std::copy(prompt.begin(), prompt.end(), input.data<int32_t>());
  GenerateStats timed;
  for (int64_t pos = static_cast<int64_t>(prompt.size()); pos < total; ++pos) {
    const auto start = std::chrono::steady_clock::now();
    Tensor logits = model.forward_cached(caches, input);
    history.penalize(logits.data<float>());
    const int32_t next = sample_token(logits.data<float>(), V, opts, static_cast<uint64_t>(pos));
    history.add_generated(next);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (out.empty()) {
      timed.prefill_tokens = input.size(1);
      timed.prefill_s = seconds;
    } else {
      ++timed.decode_tokens;
      timed.decode_s += seconds;
    }
    out.push_back(next);
    if (on_token && !on_token(score_token(logits.data<float>(), V, next, opts.logprobs))) break;
    if (next == opts.stop_token) break;
    input = Tensor::empty({1, 1}, DType::I32, MemCategory::Activations, "next_token");
    input.data<int32_t>()[0] = next;
  }
  if (stats) *stats = timed;
  return out;
}

}  // namespace megaton::infer
