// Bytes as tokens: ids 0-255 are the bytes of the text, 256 is end-of-document. Needs no vocabulary
// files and round-trips any byte string, valid UTF-8 or not, which makes it the tokenizer for tests
// and small experiments.
#pragma once
#include "megaton/data/tokenizer.h"

namespace megaton::data {

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kEod = 256;

  std::vector<int32_t> encode(std::string_view text) const override;
  // Skips end-of-document ids; ids outside [0, 256] are an error naming the id and its position.
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return kEod + 1; }
  int32_t eod() const override { return kEod; }
  std::string spec() const override { return "byte"; }
};

}  // namespace megaton::data
