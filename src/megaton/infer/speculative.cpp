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

}  // namespace

std::vector<int32_t> generate_speculative(models::TransformerModel& model, const std::vector<int32_t>& prompt,
                                          const SamplingOptions& opts, const std::function<bool(int32_t)>& on_token,
                                          GenerateStats* stats, SpeculativeStats* spec) {
  if (prompt.empty()) fail("generate: the prompt encodes to no tokens");
  if (opts.temperature != 0.0 || opts.repetition_penalty != 1.0 || opts.presence_penalty != 0.0 ||
      opts.frequency_penalty != 0.0)
    fail("speculative decoding with the MTP draft is greedy: temperature 0 and no penalties");
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
  // The greedy token of row `row` of a [rows, vocab] logits tensor.
  auto greedy = [&](const Tensor& logits, int64_t row) {
    return sample_token(logits.data<float>() + row * logits.size(1), V, opts, 0);
  };
  std::vector<int32_t> out;
  bool stopped = false;
  auto emit = [&](int32_t id) {
    out.push_back(id);
    stopped = (on_token && !on_token(id)) || id == opts.stop_token || static_cast<int64_t>(out.size()) >= budget;
  };
  GenerateStats timed;
  SpeculativeStats counts;
  auto start = std::chrono::steady_clock::now();
  // Prefill: the prompt, its greedy next token, and the draft's cache over the prompt's positions.
  Tensor hidden = model.forward_cached_hidden(caches, ids_tensor(prompt, "prompt"));
  int32_t token = greedy(model.logits(rows(hidden, n - 1, 1)), 0);
  std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
  next.push_back(token);
  Tensor drafted = model.mtp_forward_cached(draft_cache, ids_tensor(next, "next"), hidden);
  int32_t draft = greedy(model.logits(rows(drafted, n - 1, 1)), 0);
  timed.prefill_tokens = n;
  timed.prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  emit(token);
  while (!stopped) {
    start = std::chrono::steady_clock::now();
    // One main step over [token, draft]: row 0 predicts the token after `token`, row 1 the one after the draft.
    hidden = model.forward_cached_hidden(caches, ids_tensor({token, draft}, "verify"));
    ++counts.main_steps;
    ++counts.drafted;
    const size_t before = out.size();
    const Tensor logits = model.logits(hidden);  // both rows at once: the second is read when the draft holds
    std::vector<int32_t> known;  // the tokens after positions whose hidden state is now final
    const int32_t first = greedy(logits, 0);
    known.push_back(first);
    emit(first);
    if (first == draft) {
      ++counts.accepted;
      if (!stopped) {
        known.push_back(greedy(logits, 1));
        emit(known.back());
      }
    } else {
      // The draft's position holds a token that will not be there: the next step writes over it.
      for (nn::KVCache& c : caches) c.len -= 1;
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

}  // namespace megaton::infer
