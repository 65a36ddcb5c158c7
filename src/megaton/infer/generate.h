// Autoregressive generation with a KV cache: greedy (temperature 0) or sampling with
// temperature, top-k, top-p (nucleus) and min-p, reproducible from a seed; repetition (CTRL /
// Hugging Face), presence and frequency (OpenAI) penalties on the logits first.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "megaton/infer/token_logprobs.h"
#include "megaton/models/transformer_model.h"

namespace megaton::infer {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: no top-k filter
  double top_p = 1.0;        // 1: no nucleus filter
  double min_p = 0.0;        // drop tokens less likely than min_p x the most likely one; 0: off
  // A token already in the prompt or the output: its logit divided by this when positive, multiplied
  // when negative (Hugging Face's repetition_penalty). 1: off.
  double repetition_penalty = 1.0;
  // OpenAI's: logit -= presence_penalty (if the token was generated) + frequency_penalty x (times it
  // was generated), over this sequence's output. 0: off.
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  uint64_t seed = 0;
  int64_t max_new_tokens = 128;
  int32_t stop_token = -1;   // stop after emitting this id (e.g. end-of-document); -1: never
  // Only ids below this are drawn: the tokenizer's vocabulary, when the model's is larger (padded,
  // as Megatron pads it), so every generated id can be decoded. 0: every id of the model.
  int64_t vocab_size = 0;
  // -1: no log-probabilities; n in 0 .. kMaxTopLogprobs: each token's, and the n most likely ids'
  // (GeneratedToken).
  int64_t logprobs = -1;
};

// Refuses options out of range (repetition_penalty <= 0, min_p outside [0, 1], logprobs outside
// -1 .. kMaxTopLogprobs), naming `who`.
void check_sampling(const SamplingOptions& opts, const char* who);

// Picks the next token from one row of logits; `draw` indexes the RNG stream.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& opts, uint64_t draw);

// The ids a sequence has seen, for the penalties: every id of the prompt and output (repetition) and
// how often each was generated (presence, frequency).
class TokenHistory {
 public:
  TokenHistory(const SamplingOptions& opts, int64_t vocab, const std::vector<int32_t>& prompt);
  void add_generated(int32_t id);
  // Applies the penalties to one row of `vocab` logits in place (nothing when they are off).
  void penalize(float* logits) const;

 private:
  void see(int32_t id);

  double repetition_ = 1.0, presence_ = 0.0, frequency_ = 0.0;
  std::vector<uint8_t> seen_;        // per id: in the prompt or output (empty: no penalty is on)
  std::vector<int32_t> generated_;   // per id: times generated
  std::vector<int32_t> ids_;         // the distinct ids seen, for a sparse pass
};

// Where generate() spent its time, for comparing speed with other tools. Prefill: the prompt's
// forward (the GEMM path) and the first token's sampling; decode: every later step, one token each
// (batch 1: the GEMV and decode-attention path). on_token's time is in neither.
struct GenerateStats {
  int64_t prefill_tokens = 0;
  double prefill_s = 0;
  int64_t decode_tokens = 0;
  double decode_s = 0;
};

// Returns the new tokens only. on_token (optional) sees each one as it is produced (streaming; with
// its log-probabilities when opts.logprobs >= 0) and returns whether to go on: false ends
// generation after that token (a stop string, a client gone).
// stats (optional) receives the timings.
std::vector<int32_t> generate(models::TransformerModel& model, const std::vector<int32_t>& prompt,
                              const SamplingOptions& opts, const TokenCallback& on_token = {},
                              GenerateStats* stats = nullptr);

}  // namespace megaton::infer
