// libFuzzer harness: an HTTP request body of `megaton serve` (/v1/completions and
// /v1/chat/completions), read as the server reads it: JSON, then the strict request parser. A
// RequestError (answered with HTTP 400) is the expected way out; what is accepted must be in range.
#include <nlohmann/json.hpp>

#include "fuzz_input.h"
#include "megaton/infer/chat_template.h"
#include "megaton/infer/completion_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto body = nlohmann::json::parse(megaton::fuzz::as_text(data, size), nullptr, false);
  if (body.is_discarded()) return 0;
  megaton::infer::RequestLimits limits;
  for (const bool chat : {false, true}) {
    try {
      const auto r = megaton::infer::parse_completion_request(body, chat, limits);
      megaton::fuzz::require(r.max_tokens >= 1 && r.max_tokens <= limits.max_completion_tokens);
      megaton::fuzz::require(r.temperature >= 0 && r.temperature <= 2 && r.top_p > 0 && r.top_p <= 1 && r.top_k >= 0);
      megaton::fuzz::require(static_cast<int64_t>(r.stop.size()) <= limits.max_stop_strings);
      for (const auto& s : r.stop) megaton::fuzz::require(!s.empty());
      megaton::fuzz::require(chat ? !r.messages.empty() : (r.prompt.has_value() || !r.prompt_ids.empty()));
      if (chat) megaton::infer::render_chat(r.messages);
    } catch (const megaton::infer::RequestError& e) {
      megaton::fuzz::require(e.status == 400);
    }
  }
  return 0;
}
