// The JSON bodies of OpenAI's completion API: whole responses, streaming chunks and errors.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace megaton::infer {

struct ResponseHeader {
  std::string id;     // "cmpl-N" / "chatcmpl-N"
  int64_t created;    // Unix seconds
  std::string model;
  bool chat;
};

struct Usage {
  int64_t prompt_tokens, completion_tokens;
};

nlohmann::json completion_body(const ResponseHeader& h, const std::string& text, const std::string& finish_reason,
                               const Usage& usage);
// One streamed piece; finish_reason "" while the sequence runs. The first chat chunk carries the role.
nlohmann::json completion_chunk(const ResponseHeader& h, const std::string& text, const std::string& finish_reason,
                                bool first);
nlohmann::json error_body(int status, const std::string& message, const std::string& param);

// Generated text may end inside a UTF-8 character or hold bytes that are not UTF-8 (a byte-level
// model): they become U+FFFD instead of an exception.
std::string dump(const nlohmann::json& j);

}  // namespace megaton::infer
