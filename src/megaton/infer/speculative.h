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

// opts must ask for greedy decoding (temperature 0, no penalties); the model needs mtp_num_layers > 0.
std::vector<int32_t> generate_speculative(models::TransformerModel& model, const std::vector<int32_t>& prompt,
                                          const SamplingOptions& opts,
                                          const std::function<bool(int32_t)>& on_token = {},
                                          GenerateStats* stats = nullptr, SpeculativeStats* spec = nullptr);

}  // namespace megaton::infer
