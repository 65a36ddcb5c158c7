// Speculative greedy decoding: a cheap draft proposes tokens, the main model checks several in one
// step. Two drafts: DeepSeek-V3's multi-token prediction module, or a separate small model.
//
// Greedy decoding with DeepSeek-V3's multi-token prediction module as the draft model (self-
// speculative decoding, as DeepSeek serves V3): after each token the MTP depth drafts the one after
// it from the main model's hidden state; the main model then runs the token and the draft as one
// two-position step, which verifies the draft (accepted: two tokens from one main step) and yields
// the next hidden states. The tokens are exactly greedy generate()'s: the main model decides every
// one, the draft only saves steps.
#pragma once
#include "megaton/infer/generate.h"

namespace megaton::infer {

struct SpeculativeStats {
  int64_t drafted = 0;   // drafts the main model checked
  int64_t accepted = 0;  // of them, equal to its own greedy token
  int64_t main_steps = 0;  // main-model forwards after the prompt's
};

// opts must ask for greedy decoding (temperature 0, no penalties; logprobs, if asked for, are scored
// on the main model's logits each token was chosen from); the model needs mtp_num_layers > 0.
std::vector<int32_t> generate_speculative(models::TransformerModel& model, const std::vector<int32_t>& prompt,
                                          const SamplingOptions& opts, const TokenCallback& on_token = {},
                                          GenerateStats* stats = nullptr, SpeculativeStats* spec = nullptr);

// Greedy decoding with a separate, smaller draft model of the same vocabulary (speculative decoding,
// Leviathan et al. / Chen et al., greedy case): each round the draft proposes up to draft_tokens
// tokens one at a time from its own KV cache; the main model runs its last token and the proposals
// as one step, keeps the longest prefix of them equal to its own greedy tokens and adds its own
// token after it (1 to draft_tokens + 1 tokens per main step). Both caches are rolled back past the
// rejected positions. The tokens are greedy generate()'s: the main model decides every one.
// Same requirements on opts as generate_speculative; draft_tokens in 1 .. 64.
std::vector<int32_t> generate_with_draft(models::TransformerModel& model, models::TransformerModel& draft,
                                         const std::vector<int32_t>& prompt, const SamplingOptions& opts,
                                         int64_t draft_tokens, const TokenCallback& on_token = {},
                                         GenerateStats* stats = nullptr, SpeculativeStats* spec = nullptr);

}  // namespace megaton::infer
