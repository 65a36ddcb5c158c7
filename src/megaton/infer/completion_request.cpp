#include "megaton/infer/completion_request.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace megaton::infer {

namespace {

[[noreturn]] void refuse(const std::string& field, const std::string& why) {
  throw RequestError(400, field, "'" + field + "' " + why);
}

int64_t integer(const nlohmann::json& v, const std::string& field, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) refuse(field, "must be an integer");
  const bool too_big = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi);
  const int64_t x = too_big ? hi : v.get<int64_t>();
  if (too_big || x < lo || x > hi) refuse(field, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

double number(const nlohmann::json& v, const std::string& field, double lo, double hi) {
  if (!v.is_number()) refuse(field, "must be a number");
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) refuse(field, "must be in [" + nlohmann::json(lo).dump() + ", " + nlohmann::json(hi).dump() + "]");
  return x;
}

std::string text(const nlohmann::json& v, const std::string& field) {
  if (!v.is_string()) refuse(field, "must be a string");
  return v.get<std::string>();
}

// A field Megaton does not implement is accepted only at the value that means "off".
void only_default(const nlohmann::json& v, const std::string& field, const nlohmann::json& off) {
  if (!v.is_null() && v != off) refuse(field, "is not supported yet (only " + off.dump() + ")");
}

void parse_prompt(const nlohmann::json& v, CompletionRequest& r) {
  if (v.is_string()) {
    r.prompt = v.get<std::string>();
    return;
  }
  if (!v.is_array() || v.empty()) refuse("prompt", "must be a string or a non-empty array of token ids");
  if (v.size() == 1 && v[0].is_string()) {  // a batch of one prompt
    r.prompt = v[0].get<std::string>();
    return;
  }
  for (const auto& id : v) {
    if (!id.is_number_integer()) refuse("prompt", "must be a string or an array of token ids (one prompt per request)");
    r.prompt_ids.push_back(static_cast<int32_t>(integer(id, "prompt", 0, std::numeric_limits<int32_t>::max())));
  }
}

void parse_messages(const nlohmann::json& v, CompletionRequest& r) {
  if (!v.is_array() || v.empty()) refuse("messages", "must be a non-empty array");
  for (const auto& m : v) {
    if (!m.is_object()) refuse("messages", "must hold objects with 'role' and 'content'");
    ChatMessage msg;
    for (const auto& [key, value] : m.items()) {
      if (key == "role") msg.role = text(value, "messages.role");
      else if (key == "content") msg.content = text(value, "messages.content");
      else if (key != "name") refuse("messages." + key, "is not a known message field");
    }
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant")
      refuse("messages.role", "must be 'system', 'user' or 'assistant'");
    r.messages.push_back(std::move(msg));
  }
}

void parse_stop(const nlohmann::json& v, CompletionRequest& r, const RequestLimits& limits) {
  if (v.is_null()) return;
  const auto add = [&](const nlohmann::json& s) {
    std::string t = text(s, "stop");
    if (t.empty()) refuse("stop", "must not hold an empty string");
    r.stop.push_back(std::move(t));
  };
  if (v.is_string()) return add(v);
  if (!v.is_array()) refuse("stop", "must be a string or an array of strings");
  if (static_cast<int64_t>(v.size()) > limits.max_stop_strings)
    refuse("stop", "holds more than " + std::to_string(limits.max_stop_strings) + " strings");
  for (const auto& s : v) add(s);
}

}  // namespace

CompletionRequest parse_completion_request(const nlohmann::json& body, bool chat, const RequestLimits& limits) {
  if (!body.is_object()) throw RequestError(400, "", "the request body must be a JSON object");
  CompletionRequest r;
  r.chat = chat;
  if (chat) r.max_tokens = limits.max_completion_tokens;
  bool has_input = false;
  // Chat asks with logprobs: true and the alternatives with top_logprobs (which needs it).
  bool chat_logprobs = false;
  std::optional<int64_t> top_logprobs;
  for (const auto& [key, v] : body.items()) {
    if (key == "model") r.model = text(v, key);
    else if (!chat && key == "prompt") parse_prompt(v, r), has_input = true;
    else if (chat && key == "messages") parse_messages(v, r), has_input = true;
    else if (key == "max_tokens" || (chat && key == "max_completion_tokens")) {
      if (!v.is_null()) r.max_tokens = integer(v, key, 1, limits.max_completion_tokens);
    } else if (key == "temperature") {
      if (!v.is_null()) r.temperature = number(v, key, 0.0, 2.0);
    } else if (key == "top_p") {
      if (!v.is_null()) r.top_p = number(v, key, std::numeric_limits<double>::min(), 1.0);
    } else if (key == "top_k") {
      if (!v.is_null()) r.top_k = integer(v, key, 0, std::numeric_limits<int32_t>::max());
    } else if (key == "min_p") {
      if (!v.is_null()) r.min_p = number(v, key, 0.0, 1.0);
    } else if (key == "repetition_penalty") {
      if (!v.is_null()) r.repetition_penalty = number(v, key, 0.01, 100.0);
    } else if (key == "presence_penalty") {
      if (!v.is_null()) r.presence_penalty = number(v, key, -2.0, 2.0);
    } else if (key == "frequency_penalty") {
      if (!v.is_null()) r.frequency_penalty = number(v, key, -2.0, 2.0);
    } else if (key == "seed") {
      if (!v.is_null()) r.seed = static_cast<uint64_t>(integer(v, key, 0, std::numeric_limits<int64_t>::max()));
    } else if (key == "stop") parse_stop(v, r, limits);
    else if (key == "stream") {
      if (!v.is_boolean()) refuse(key, "must be true or false");
      r.stream = v.get<bool>();
    } else if (key == "n") only_default(v, key, 1);
    else if (key == "logprobs") {
      if (v.is_null()) continue;
      if (!chat) {
        r.logprobs = integer(v, key, 0, kMaxCompletionLogprobs);
      } else {
        if (!v.is_boolean()) refuse(key, "must be true or false");
        chat_logprobs = v.get<bool>();
      }
    } else if (chat && key == "top_logprobs") {
      if (!v.is_null()) top_logprobs = integer(v, key, 0, kMaxTopLogprobs);
    } else if (!chat && key == "echo")
      only_default(v, key, false);
    else if (key == "user") text(v, key);  // an end-user id for the caller's logs: nothing to do here
    else refuse(key, "is not a known field of a " + std::string(chat ? "chat completion" : "completion") + " request");
  }
  if (!has_input) refuse(chat ? "messages" : "prompt", "is required");
  if (top_logprobs && !chat_logprobs) refuse("top_logprobs", "needs 'logprobs': true");
  if (chat_logprobs) r.logprobs = top_logprobs.value_or(0);
  return r;
}

}  // namespace megaton::infer
