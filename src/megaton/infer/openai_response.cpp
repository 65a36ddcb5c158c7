#include "megaton/infer/openai_response.h"

namespace megaton::infer {

namespace {

nlohmann::json header(const ResponseHeader& h, const char* object) {
  return {{"id", h.id}, {"object", object}, {"created", h.created}, {"model", h.model}};
}

nlohmann::json finish(const std::string& reason) { return reason.empty() ? nlohmann::json() : nlohmann::json(reason); }

nlohmann::json utf8_bytes(const std::string& s) {
  nlohmann::json b = nlohmann::json::array();
  for (const char c : s) b.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return b;
}

// The choice's "logprobs": null unless asked for. A token's text may be part of a UTF-8 character
// (byte-level models): chat gives its bytes, and dump() writes the text with U+FFFD.
nlohmann::json logprobs(const ResponseHeader& h, const std::vector<LoggedToken>& tokens, int64_t text_offset) {
  if (h.logprobs < 0) return nullptr;
  if (h.chat) {
    nlohmann::json content = nlohmann::json::array();
    for (const LoggedToken& t : tokens) {
      nlohmann::json top = nlohmann::json::array();
      for (const auto& [text, lp] : t.top)
        top.push_back({{"token", text}, {"logprob", lp}, {"bytes", utf8_bytes(text)}});
      content.push_back(
          {{"token", t.text}, {"logprob", t.logprob}, {"bytes", utf8_bytes(t.text)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  nlohmann::json texts = nlohmann::json::array(), lps = nlohmann::json::array(), tops = nlohmann::json::array(),
                 offsets = nlohmann::json::array();
  for (const LoggedToken& t : tokens) {
    texts.push_back(t.text);
    lps.push_back(t.logprob);
    nlohmann::json top = nlohmann::json::object();
    for (const auto& [text, lp] : t.top) top.emplace(text, lp);  // a text seen twice keeps its likelier id
    tops.push_back(h.logprobs > 0 ? top : nlohmann::json());
    offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(t.text.size());
  }
  return {{"tokens", texts}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

}  // namespace

nlohmann::json completion_body(const ResponseHeader& h, const std::string& text, const std::string& finish_reason,
                               const Usage& usage, const std::vector<LoggedToken>& tokens) {
  nlohmann::json j = header(h, h.chat ? "chat.completion" : "text_completion");
  nlohmann::json choice = {{"index", 0}, {"finish_reason", finish(finish_reason)}};
  if (h.chat)
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  else
    choice["text"] = text;
  choice["logprobs"] = logprobs(h, tokens, 0);
  j["choices"] = nlohmann::json::array({choice});
  j["usage"] = {{"prompt_tokens", usage.prompt_tokens},
                {"completion_tokens", usage.completion_tokens},
                {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
  return j;
}

nlohmann::json completion_chunk(const ResponseHeader& h, const std::string& text, const std::string& finish_reason,
                                bool first, const std::vector<LoggedToken>& tokens, int64_t text_offset) {
  nlohmann::json j = header(h, h.chat ? "chat.completion.chunk" : "text_completion");
  nlohmann::json choice = {{"index", 0}, {"finish_reason", finish(finish_reason)}};
  if (h.chat) {
    nlohmann::json delta = nlohmann::json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = logprobs(h, tokens, text_offset);
  j["choices"] = nlohmann::json::array({choice});
  return j;
}

nlohmann::json error_body(int status, const std::string& message, const std::string& param) {
  const char* type = status == 401 ? "authentication_error"
                     : status == 429 ? "rate_limit_error"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  return {{"error",
           {{"message", message}, {"type", type}, {"param", param.empty() ? nlohmann::json() : nlohmann::json(param)},
            {"code", nullptr}}}};
}

std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

}  // namespace megaton::infer
