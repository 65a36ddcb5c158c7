// The OpenAI request parser: every field typed and ranged, unknown and unsupported ones refused by
// name (planted: the unknown-field branch accepting anything: caught).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "megaton/infer/chat_template.h"
#include "megaton/infer/completion_request.h"

using namespace megaton::infer;

namespace {

CompletionRequest parse(const char* text, bool chat = false) {
  RequestLimits limits;
  limits.max_completion_tokens = 100;
  return parse_completion_request(nlohmann::json::parse(text), chat, limits);
}

// The field a refused request names.
std::string refused(const char* text, bool chat = false) {
  try {
    parse(text, chat);
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find(e.param), std::string::npos) << e.what();
    return e.param;
  }
  ADD_FAILURE() << "accepted: " << text;
  return "";
}

}  // namespace

TEST(CompletionRequest, ReadsEveryField) {
  const auto r = parse(R"({"model":"m","prompt":"hi","max_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":40,
                           "seed":3,"stop":["a","b"],"stream":true,"n":1,"presence_penalty":0.5,"logprobs":null,
                           "frequency_penalty":-1,"repetition_penalty":1.3,"min_p":0.05,
                           "echo":false,"user":"u"})");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt, "hi");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.temperature, 0.5);
  EXPECT_EQ(r.top_p, 0.9);
  EXPECT_EQ(r.top_k, 40);
  EXPECT_EQ(r.seed, 3u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.presence_penalty, 0.5);
  EXPECT_EQ(r.frequency_penalty, -1);
  EXPECT_EQ(r.repetition_penalty, 1.3);
  EXPECT_EQ(r.min_p, 0.05);
  EXPECT_EQ(parse(R"({"prompt":"x"})").max_tokens, 16);  // OpenAI's default
  EXPECT_EQ(parse(R"({"prompt":"x","stop":"end"})").stop, std::vector<std::string>{"end"});
}

TEST(CompletionRequest, PromptsAsIdsOrABatchOfOne) {
  EXPECT_EQ(parse(R"({"prompt":[1,2,3]})").prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse(R"({"prompt":["only"]})").prompt, "only");
  EXPECT_EQ(refused(R"({"prompt":["a","b"]})"), "prompt");
  EXPECT_EQ(refused(R"({"prompt":[1,-2]})"), "prompt");
  EXPECT_EQ(refused(R"({"prompt":[]})"), "prompt");
  EXPECT_EQ(refused(R"({"prompt":5})"), "prompt");
  EXPECT_EQ(refused(R"({"max_tokens":5})"), "prompt");  // required
}

TEST(CompletionRequest, ChatMessagesAndTheirTemplate) {
  const auto r = parse(R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]})", true);
  EXPECT_EQ(r.max_tokens, 100);  // chat's default: the server's limit
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(render_chat(r.messages), "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n");
  EXPECT_EQ(parse(R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":9})", true).max_tokens, 9);
  EXPECT_EQ(refused(R"({"messages":[{"role":"robot","content":"x"}]})", true), "messages.role");
  EXPECT_EQ(refused(R"({"messages":[{"role":"user","content":3}]})", true), "messages.content");
  EXPECT_EQ(refused(R"({"messages":[{"role":"user","content":"x","tool_calls":[]}]})", true), "messages.tool_calls");
  EXPECT_EQ(refused(R"({"messages":[]})", true), "messages");
  EXPECT_EQ(refused(R"({"prompt":"x"})", true), "prompt");  // a completions field on the chat endpoint
  EXPECT_EQ(refused(R"({"messages":[{"role":"user","content":"x"}]})"), "messages");
}

TEST(CompletionRequest, RefusesOutOfRangeAndMistypedValuesByName) {
  EXPECT_EQ(refused(R"({"prompt":"x","max_tokens":0})"), "max_tokens");
  EXPECT_EQ(refused(R"({"prompt":"x","max_tokens":101})"), "max_tokens");
  EXPECT_EQ(refused(R"({"prompt":"x","max_tokens":18446744073709551615})"), "max_tokens");
  EXPECT_EQ(refused(R"({"prompt":"x","max_tokens":"5"})"), "max_tokens");
  EXPECT_EQ(refused(R"({"prompt":"x","max_tokens":5.0})"), "max_tokens");
  EXPECT_EQ(refused(R"({"prompt":"x","temperature":2.5})"), "temperature");
  EXPECT_EQ(refused(R"({"prompt":"x","temperature":-0.1})"), "temperature");
  EXPECT_EQ(refused(R"({"prompt":"x","top_p":0})"), "top_p");
  EXPECT_EQ(refused(R"({"prompt":"x","top_k":-1})"), "top_k");
  EXPECT_EQ(refused(R"({"prompt":"x","seed":-1})"), "seed");
  EXPECT_EQ(refused(R"({"prompt":"x","presence_penalty":2.5})"), "presence_penalty");
  EXPECT_EQ(refused(R"({"prompt":"x","frequency_penalty":-3})"), "frequency_penalty");
  EXPECT_EQ(refused(R"({"prompt":"x","repetition_penalty":0})"), "repetition_penalty");
  EXPECT_EQ(refused(R"({"prompt":"x","min_p":1.5})"), "min_p");
  EXPECT_EQ(refused(R"({"prompt":"x","stream":"yes"})"), "stream");
  EXPECT_EQ(refused(R"({"prompt":"x","stop":["a","b","c","d","e"]})"), "stop");
  EXPECT_EQ(refused(R"({"prompt":"x","stop":[""]})"), "stop");
  EXPECT_EQ(refused(R"({"prompt":"x","stop":[1]})"), "stop");
}

// Completions ask for logprobs with an integer (0 .. 5 alternatives), chat with logprobs: true and
// top_logprobs (0 .. 20, only with logprobs); absent or null: none (-1).
TEST(CompletionRequest, LogprobsAsCompletionsAndChatAskForThem) {
  EXPECT_EQ(parse(R"({"prompt":"x"})").logprobs, -1);
  EXPECT_EQ(parse(R"({"prompt":"x","logprobs":null})").logprobs, -1);
  EXPECT_EQ(parse(R"({"prompt":"x","logprobs":0})").logprobs, 0);
  EXPECT_EQ(parse(R"({"prompt":"x","logprobs":5})").logprobs, 5);
  EXPECT_EQ(refused(R"({"prompt":"x","logprobs":-1})"), "logprobs");
  EXPECT_EQ(refused(R"({"prompt":"x","logprobs":true})"), "logprobs");
  EXPECT_EQ(refused(R"({"prompt":"x","top_logprobs":2})"), "top_logprobs");  // a chat field
  const char* msg = R"("messages":[{"role":"user","content":"hi"}])";
  const auto chat = [&](const std::string& rest) { return "{" + std::string(msg) + rest + "}"; };
  EXPECT_EQ(parse(chat("").c_str(), true).logprobs, -1);
  EXPECT_EQ(parse(chat(R"(,"logprobs":false)").c_str(), true).logprobs, -1);
  EXPECT_EQ(parse(chat(R"(,"logprobs":true)").c_str(), true).logprobs, 0);
  EXPECT_EQ(parse(chat(R"(,"logprobs":true,"top_logprobs":20)").c_str(), true).logprobs, 20);
  EXPECT_EQ(refused(chat(R"(,"logprobs":true,"top_logprobs":21)").c_str(), true), "top_logprobs");
  EXPECT_EQ(refused(chat(R"(,"top_logprobs":2)").c_str(), true), "top_logprobs");
  EXPECT_EQ(refused(chat(R"(,"logprobs":false,"top_logprobs":2)").c_str(), true), "top_logprobs");
  EXPECT_EQ(refused(chat(R"(,"logprobs":3)").c_str(), true), "logprobs");
}

TEST(CompletionRequest, RefusesUnknownAndUnsupportedFields) {
  EXPECT_EQ(refused(R"({"prompt":"x","temprature":0})"), "temprature");
  EXPECT_EQ(refused(R"({"prompt":"x","n":2})"), "n");
  EXPECT_EQ(refused(R"({"prompt":"x","logprobs":6})"), "logprobs");
  EXPECT_EQ(refused(R"({"prompt":"x","echo":true})"), "echo");
  EXPECT_THROW(parse("[1,2]"), RequestError);
}
