// Byte-level BPE (GPT-2, tiktoken, Llama 3): text is split into pieces by the vocabulary's regex, each
// piece starts as its bytes (every byte is a token) and adjacent tokens merge, lowest rank first, until
// no pair has a rank. decode(encode(x)) == x for any bytes, valid UTF-8 or not.
#pragma once
#include <string>
#include <unordered_map>

#include "megaton/data/bpe_vocabulary.h"
#include "megaton/data/pretokenizer.h"
#include "megaton/data/tokenizer.h"

namespace megaton::data {

// Lets maps keyed by std::string be searched with a std::string_view, without a copy.
struct TransparentStringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

class BpeTokenizer final : public Tokenizer {
 public:
  // `spec` names the tokenizer in errors and in spec(); a vocabulary without all 256 bytes is an error.
  BpeTokenizer(BpeVocabulary vocab, std::string spec);

  // Special-token text in the input is encoded as ordinary text (tiktoken's encode_ordinary), so a corpus
  // cannot inject end-of-document; preprocessing appends eod explicitly.
  std::vector<int32_t> encode(std::string_view text) const override;
  // Special tokens decode to their text; ids that name no token are an error naming id and position.
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(vocab_.tokens.size()); }
  int32_t eod() const override { return vocab_.eod; }
  std::string spec() const override { return spec_; }

 private:
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void merge(std::string_view piece, std::vector<int32_t>& out) const;

  BpeVocabulary vocab_;
  std::string spec_;
  Pretokenizer pretokenizer_;
  std::unordered_map<std::string, int32_t, TransparentStringHash, std::equal_to<>>
      ids_;  // ordinary tokens (no specials) by their bytes
  int32_t byte_ids_[256];
  uint64_t cache_owner_;  // identifies this tokenizer to the per-thread piece cache
};

}  // namespace megaton::data
