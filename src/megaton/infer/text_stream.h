// Generated ids -> text that is safe to show as it streams. A token decoded alone can lose context
// (SentencePiece's leading space, a UTF-8 character split over byte tokens), so the whole
// continuation is decoded after each id and only its new tail is released; that tail is held back
// while it ends in an incomplete UTF-8 character or could still grow into a stop string. When a stop
// string appears the text ends just before it (OpenAI's `stop`: the stop string is not returned).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "megaton/data/tokenizer.h"

namespace megaton::infer {

class TextStream {
 public:
  TextStream(const data::Tokenizer& tokenizer, std::vector<std::string> stop_strings);

  // Adds one generated id; returns the text it releases (often empty). After stopped(), nothing.
  std::string push(int32_t id);
  // Whatever is still held back, at the end of generation (an incomplete UTF-8 tail included).
  std::string finish();
  bool stopped() const { return stopped_; }
  // Everything released so far, plus the held-back tail after finish().
  const std::string& text() const { return released_; }

 private:
  size_t held_back(const std::string& text) const;  // bytes at its end not yet safe to release

  const data::Tokenizer& tokenizer_;
  std::vector<std::string> stops_;
  std::vector<int32_t> ids_;
  std::string decoded_, released_;
  bool stopped_ = false;
};

}  // namespace megaton::infer
