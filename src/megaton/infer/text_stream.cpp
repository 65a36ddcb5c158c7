#include "megaton/infer/text_stream.h"

#include <algorithm>

#include "megaton/core/error.h"

namespace megaton::infer {

namespace {

// Bytes of an unfinished UTF-8 character at the end of `s` (0 when it ends on a boundary). Bytes
// that can never become valid UTF-8 are not held: the tokenizer produced them, waiting is no use.
size_t incomplete_utf8_tail(const std::string& s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back for the lead
    const size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

}  // namespace

TextStream::TextStream(const data::Tokenizer& tokenizer, std::vector<std::string> stop_strings)
    : tokenizer_(tokenizer), stops_(std::move(stop_strings)) {
  for (const std::string& s : stops_)
    if (s.empty()) fail("stop strings must not be empty");
}

size_t TextStream::held_back(const std::string& text) const {
  size_t hold = incomplete_utf8_tail(text);
  // The longest end of `text` that begins some stop string (a stop could still complete there).
  for (const std::string& stop : stops_)
    for (size_t len = std::min(stop.size() - 1, text.size()); len > hold; --len)
      if (text.compare(text.size() - len, len, stop, 0, len) == 0) {
        hold = len;
        break;
      }
  return hold;
}

std::string TextStream::push(int32_t id) {
  if (stopped_) return {};
  ids_.push_back(id);
  decoded_ = tokenizer_.decode(ids_);
  // The earliest stop string wins. One can only start in the text not yet released: any end of the
  // released text that began a stop string was held back.
  size_t cut = std::string::npos;
  for (const std::string& stop : stops_) cut = std::min(cut, decoded_.find(stop, released_.size()));
  size_t end = decoded_.size() - held_back(decoded_);
  if (cut != std::string::npos) {
    stopped_ = true;
    end = cut;
  }
  if (end <= released_.size()) return {};
  std::string out = decoded_.substr(released_.size(), end - released_.size());
  released_.append(out);
  return out;
}

std::string TextStream::finish() {
  if (stopped_ || decoded_.size() <= released_.size()) return {};
  std::string out = decoded_.substr(released_.size());
  released_.append(out);
  return out;
}

}  // namespace megaton::infer
