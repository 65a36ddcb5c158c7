#include "megaton/infer/chat_template.h"

namespace megaton::infer {

std::string render_chat(const std::vector<ChatMessage>& messages) {
  std::string out;
  for (const ChatMessage& m : messages) out += "<|" + m.role + "|>\n" + m.content + "\n";
  return out + "<|assistant|>\n";
}

}  // namespace megaton::infer
