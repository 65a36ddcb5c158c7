// The JSON bodies of OpenAI's completion API: whole responses, streaming chunks and errors.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace megaton::infer {

struct ResponseHeader {
  std::string id;     // "cmpl-N" / "chatcmpl-N"
  int64_t created;    // Unix seconds
  std::string model;
  bool chat;
  int64_t logprobs = -1;  // alternatives per token asked for (0 .. 20); -1: no logprobs
};

// A generated token's text and log-probability, and its most likely alternatives' (the request's
// logprobs / top_logprobs).
struct LoggedToken {
  std::string text;
  float logprob;
  std::vector<std::pair<std::string, float>> top;
};

struct Usage {
  int64_t prompt_tokens, completion_tokens;
};

// `tokens`: every generated token's logprobs, reported when h.logprobs >= 0 (completions: tokens,
// token_logprobs, top_logprobs, text_offset; chat: content[] with token, logprob, bytes, top_logprobs).
nlohmann::json completion_body(const ResponseHeader& h, const std::string& text, const std::string& finish_reason,
                               const Usage& usage, const std::vector<LoggedToken>& tokens = {});
// One streamed piece; finish_reason "" while the sequence runs. The first chat chunk carries the role.
// `tokens`: the logprobs of the tokens generated since the last chunk; `text_offset` the bytes of
// token text sent before them (completions' text_offset counts on from it).
nlohmann::json completion_chunk(const ResponseHeader& h, const std::string& text, const std::string& finish_reason,
                                bool first, const std::vector<LoggedToken>& tokens = {}, int64_t text_offset = 0);
nlohmann::json error_body(int status, const std::string& message, const std::string& param);

// Generated text may end inside a UTF-8 character or hold bytes that are not UTF-8 (a byte-level
// model): they become U+FFFD instead of an exception.
std::string dump(const nlohmann::json& j);

}  // namespace megaton::infer
