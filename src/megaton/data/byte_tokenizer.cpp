#include "megaton/data/byte_tokenizer.h"

#include "megaton/core/error.h"

namespace megaton::data {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  text.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids[i];
    if (id == kEod) continue;
    if (id < 0 || id > kEod)
      fail("byte tokenizer: id ", id, " at position ", i, " is outside the vocabulary [0, ", kEod, "]");
    text.push_back(static_cast<char>(id));
  }
  return text;
}

}  // namespace megaton::data
