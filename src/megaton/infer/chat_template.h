// Chat messages -> one prompt text. Megaton does not evaluate the Jinja `chat_template` of a Hugging
// Face tokenizer_config.json yet; every model gets this documented default, one block per message
// and an open assistant block to continue:
//   <|system|>\n{content}\n<|user|>\n{content}\n<|assistant|>\n
// and generation stops where the model starts another block ("\n<|", added to the stop strings).
#pragma once
#include <string>
#include <vector>

#include "megaton/infer/completion_request.h"

namespace megaton::infer {

std::string render_chat(const std::vector<ChatMessage>& messages);
inline constexpr const char* kChatTurnStop = "\n<|";

}  // namespace megaton::infer
