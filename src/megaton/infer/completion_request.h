// OpenAI-compatible request bodies (/v1/completions, /v1/chat/completions) -> what generation needs,
// validated strictly: every field is known, typed and in range, or the request is refused with a
// RequestError naming the field (HTTP 400). Features Megaton does not have yet (n > 1, echo) are
// refused rather than silently ignored.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "megaton/infer/token_logprobs.h"

namespace megaton::infer {

struct RequestError : std::runtime_error {
  RequestError(int status, std::string param, const std::string& message)
      : std::runtime_error(message), status(status), param(std::move(param)) {}
  int status;         // HTTP status
  std::string param;  // the offending field ("" when none)
};

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// Completions' logprobs asks for up to 5 alternatives (OpenAI's legacy limit); chat's top_logprobs
// up to kMaxTopLogprobs.
inline constexpr int64_t kMaxCompletionLogprobs = 5;

struct RequestLimits {
  int64_t max_completion_tokens = 1024;  // the most a request may ask for (and chat's default)
  int64_t max_stop_strings = 4;          // as OpenAI
};

struct CompletionRequest {
  bool chat = false;
  std::string model;                     // informational: one model is served
  std::optional<std::string> prompt;     // completions: text ...
  std::vector<int32_t> prompt_ids;       // ... or token ids
  std::vector<ChatMessage> messages;     // chat
  int64_t max_tokens = 16;               // OpenAI's completions default; chat: the limit
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;                     // extensions with vLLM's names: top_k (0: off), min_p,
  double min_p = 0.0;                    // repetition_penalty
  double repetition_penalty = 1.0;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  // -1: no logprobs; n >= 0: each token's log-probability and n alternatives' (completions:
  // logprobs: n; chat: logprobs: true, top_logprobs: n).
  int64_t logprobs = -1;
};

// Throws RequestError (400) on any field that is unknown, mistyped or out of range.
CompletionRequest parse_completion_request(const nlohmann::json& body, bool chat, const RequestLimits& limits);

}  // namespace megaton::infer
