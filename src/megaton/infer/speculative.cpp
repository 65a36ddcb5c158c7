#include "megaton/infer/speculative.h"

#include <chrono>

namespace megaton::infer {

namespace {

Tensor ids_tensor(const std::vector<int32_t>& ids, const char* name) {
  Tensor t = Tensor::empty({1, static_cast<int64_t>(ids.size())}, DType::I32, MemCategory::Activations, name);
  std::copy(ids.begin(), ids.end(), t.data<int32_t>());
  return t;
}

// Rows [first, first + n) of a [rows, C] tensor.
Tensor rows(const Tensor& h, int64_t first, int64_t n) { return h.slice_rows(first, first + n); }

void expect_greedy(const SamplingOptions& opts, const char* draft) {
  if (opts.temperature != 0.0 || opts.repetition_penalty != 1.0 || opts.presence_penalty != 0.0 ||
      opts.frequency_penalty != 0.0)
    fail("speculative decoding with ", draft, " is greedy: temperature 0 and no penalties");
}

// The greedy token of row `row` of a [rows, vocab] logits tensor, over its first V ids.
int32_t greedy_at(const Tensor& logits, int64_t row, int64_t V, const SamplingOptions& opts) {
  return sample_token(logits.data<float>() + row * logits.size(1), V, opts, 0);
}

// That token as emitted: scored on the same row when opts.logprobs asks for it.
GeneratedToken emitted_at(const Tensor& logits, int64_t row, int64_t V, const SamplingOptions& opts) {
  return score_token(logits.data<float>() + row * logits.size(1), V, greedy_at(logits, row, V, opts), opts.logprobs);
}

void drop_last(std::vector<nn::KVCache>& caches, int64_t n) {
  for (nn::KVCache& c : caches) c.len -= n;
}

}  // namespace

std::vector<int32_t> generate_speculative(models::TransformerModel& model, const std::vector<int32_t>& prompt,
                                          const SamplingOptions& opts, const TokenCallback& on_token,
                                          GenerateStats* stats, SpeculativeStats* spec) {
  if (prompt.empty()) fail("generate: the prompt encodes to no tokens");
  expect_greedy(opts, "the MTP draft");
  if (model.mtp_layers().empty())
    fail("speculative decoding needs a model with multi-token prediction layers (mtp_num_layers / "
         "num_nextn_predict_layers > 0)");
  const int64_t max_len = model.config().max_position_embeddings, n = static_cast<int64_t>(prompt.size());
  if (n >= max_len) fail("generate: prompt of ", n, " tokens leaves no room in the model's ", max_len, " positions");
  const int64_t budget = std::min<int64_t>(n + opts.max_new_tokens, max_len) - n;  // tokens to emit at most
  model.refresh_compute_weights();
  auto caches = model.new_kv_caches(1, n + budget);
  nn::KVCache draft_cache = model.new_mtp_cache(1, n + budget);
  const int64_t V = opts.vocab_size > 0 ? std::min(opts.vocab_size, model.config().vocab_size) : model.config().vocab_size;
  auto greedy = [&](const Tensor& logits, int64_t row) { return greedy_at(logits, row, V, opts); };
  std::vector<int32_t> out;
  bool stopped = false;
  // The greedy token of `row` of the main model's logits.
  auto emit = [&](const Tensor& logits, int64_t row) {
    const GeneratedToken t = emitted_at(logits, row, V, opts);
    out.push_back(t.id);
    stopped = (on_token && !on_token(t)) || t.id == opts.stop_token || static_cast<int64_t>(out.size()) >= budget;
  };
  GenerateStats timed;
  SpeculativeStats counts;
  auto start = std::chrono::steady_clock::now();
  // Prefill: the prompt, its greedy next token, and the draft's cache over the prompt's positions.
  Tensor hidden = model.forward_cached_hidden(caches, ids_tensor(prompt, "prompt"));
  const Tensor first_logits = model.logits(rows(hidden, n - 1, 1));
  int32_t token = greedy(first_logits, 0);
  std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
  next.push_back(token);
  Tensor drafted = model.mtp_forward_cached(draft_cache, ids_tensor(next, "next"), hidden);
  int32_t draft = greedy(model.logits(rows(drafted, n - 1, 1)), 0);
  timed.prefill_tokens = n;
  timed.prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  emit(first_logits, 0);
  while (!stopped) {
    start = std::chrono::steady_clock::now();
    // One main step over [token, draft]: row 0 predicts the token after `token`, row 1 the one after the draft.
    hidden = model.forward_cached_hidden(caches, ids_tensor({token, draft}, "verify"));
    ++counts.main_steps;
    ++counts.drafted;
    const size_t before = out.size();
    const Tensor logits = model.logits(hidden);  // both rows at once: the second is read when the draft holds
    std::vector<int32_t> known;  // the tokens after positions whose hidden state is now final
    emit(logits, 0);
    known.push_back(out.back());
    if (out.back() == draft) {
      ++counts.accepted;
      if (!stopped) {
        emit(logits, 1);
        known.push_back(out.back());
      }
    } else {
      // The draft's position holds a token that will not be there: the next step writes over it.
      drop_last(caches, 1);
    }
    if (!stopped) {
      // The draft after the last known token, from the hidden states of the positions just verified.
      const auto k = static_cast<int64_t>(known.size());
      drafted = model.mtp_forward_cached(draft_cache, ids_tensor(known, "next"), rows(hidden, 0, k));
      token = known.back();
      draft = greedy(model.logits(rows(drafted, k - 1, 1)), 0);
    }
    timed.decode_tokens += static_cast<int64_t>(out.size() - before);
    timed.decode_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  if (stats) *stats = timed;
  if (spec) *spec = counts;
  return out;
}

std::vector<int32_t> generate_with_draft(models::TransformerModel& model, models::TransformerModel& draft,
                                         const std::vector<int32_t>& prompt, const SamplingOptions& opts,
                                         int64_t draft_tokens, const TokenCallback& on_token, GenerateStats* stats,
                                         SpeculativeStats* spec) {
  if (prompt.empty()) fail("generate: the prompt encodes to no tokens");
  expect_greedy(opts, "a draft model");
  if (draft_tokens < 1 || draft_tokens > 64) fail("draft tokens per step ", draft_tokens, " outside 1 .. 64");
  if (draft.config().vocab_size != model.config().vocab_size)
    fail("the draft model's vocabulary (", draft.config().vocab_size, " ids) differs from the model's (",
         model.config().vocab_size, "): a draft must share the tokenizer");
  const int64_t max_len = model.config().max_position_embeddings, n = static_cast<int64_t>(prompt.size());
  const int64_t draft_max = draft.config().max_position_embeddings;
  if (n >= max_len) fail("generate: prompt of ", n, " tokens leaves no room in the model's ", max_len, " positions");
  if (n > draft_max) fail("generate: prompt of ", n, " tokens is longer than the draft model's ", draft_max, " positions");
  const int64_t budget = std::min<int64_t>(n + opts.max_new_tokens, max_len) - n;
  model.refresh_compute_weights();
  draft.refresh_compute_weights();
  // Room for the prompt, every emitted token and one round's proposals past the last.
  auto caches = model.new_kv_caches(1, std::min(max_len, n + budget + draft_tokens));
  auto draft_caches = draft.new_kv_caches(1, std::min(draft_max, n + budget + draft_tokens));
  const int64_t V = opts.vocab_size > 0 ? std::min(opts.vocab_size, model.config().vocab_size) : model.config().vocab_size;
  auto greedy = [&](const Tensor& logits, int64_t row) { return greedy_at(logits, row, V, opts); };
  std::vector<int32_t> seq = prompt, out;
  bool stopped = false;
  // The greedy token of `row` of the main model's logits.
  auto emit = [&](const Tensor& logits, int64_t row) {
    const GeneratedToken t = emitted_at(logits, row, V, opts);
    seq.push_back(t.id);
    out.push_back(t.id);
    stopped = (on_token && !on_token(t)) || t.id == opts.stop_token || static_cast<int64_t>(out.size()) >= budget;
  };
  GenerateStats timed;
  SpeculativeStats counts;
  auto start = std::chrono::steady_clock::now();
  // Prefill: the main model's first token; the draft reads the prompt in its first round.
  emit(model.forward_cached(caches, ids_tensor(prompt, "prompt")), 0);
  timed.prefill_tokens = n;
  timed.prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t draft_len = 0;  // tokens of seq in the draft's cache
  while (!stopped) {
    start = std::chrono::steady_clock::now();
    const auto L = static_cast<int64_t>(seq.size());  // the main cache holds L - 1 of them
    // Proposals: no more than could be emitted, and the positions both models have.
    const int64_t k = std::max<int64_t>(
        0, std::min({draft_tokens, budget - static_cast<int64_t>(out.size()) - 1, max_len - L, draft_max - L + 1}));
    std::vector<int32_t> verify{seq.back()};
    if (k > 0) {
      Tensor logits = draft.forward_cached(draft_caches, ids_tensor({seq.begin() + draft_len, seq.end()}, "draft_in"));
      draft_len = L;
      verify.push_back(greedy(logits, 0));
      for (int64_t i = 1; i < k; ++i, ++draft_len) {
        logits = draft.forward_cached(draft_caches, ids_tensor({verify.back()}, "draft_in"));
        verify.push_back(greedy(logits, 0));
      }
    }
    // Row i of the main step predicts the token after verify[i].
    const Tensor logits = model.logits(model.forward_cached_hidden(caches, ids_tensor(verify, "verify")));
    ++counts.main_steps;
    counts.drafted += k;
    const size_t before = out.size();
    int64_t accepted = 0;
    emit(logits, 0);
    while (!stopped && accepted < k && verify[static_cast<size_t>(accepted + 1)] == out.back()) {
      ++accepted;
      emit(logits, accepted);
    }
    counts.accepted += accepted;
    // Keep the positions of the last token and the accepted proposals; the draft never read its last.
    drop_last(caches, k - accepted);
    const int64_t draft_keep = std::min(draft_len, L + accepted);
    drop_last(draft_caches, draft_len - draft_keep);
    draft_len = draft_keep;
    timed.decode_tokens += static_cast<int64_t>(out.size() - before);
    timed.decode_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  if (stats) *stats = timed;
  if (spec) *spec = counts;
  return out;
}

}  // namespace megaton::infer
