#include "megaton/infer/openai_response.h"

namespace megaton::infer {

namespace {

nlohmann::json header(const ResponseHeader& h, const char* object) {
  return {{"id", h.id}, {"object", object}, {"created", h.created}, {"model", h.model}};
}

nlohmann::json finish(const std::string& reason) { return reason.empty() ? nlohmann::json() : nlohmann::json(reason); }

}  // namespace

nlohmann::json completion_body(const ResponseHeader& h, const std::string& text, const std::string& finish_reason,
                               const Usage& usage) {
  nlohmann::json j = header(h, h.chat ? "chat.completion" : "text_completion");
  nlohmann::json choice = {{"index", 0}, {"finish_reason", finish(finish_reason)}};
  if (h.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
    choice["logprobs"] = nullptr;
  }
  j["choices"] = nlohmann::json::array({choice});
  j["usage"] = {{"prompt_tokens", usage.prompt_tokens},
                {"completion_tokens", usage.completion_tokens},
                {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
  return j;
}

nlohmann::json completion_chunk(const ResponseHeader& h, const std::string& text, const std::string& finish_reason,
                                bool first) {
  nlohmann::json j = header(h, h.chat ? "chat.completion.chunk" : "text_completion");
  nlohmann::json choice = {{"index", 0}, {"finish_reason", finish(finish_reason)}};
  if (h.chat) {
    nlohmann::json delta = nlohmann::json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
    choice["logprobs"] = nullptr;
  }
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
