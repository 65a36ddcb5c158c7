#include "megaton/data/tokenizer.h"

#include "megaton/core/error.h"
#include "megaton/data/bpe_tokenizer.h"
#include "megaton/data/byte_tokenizer.h"
#include "megaton/data/sentencepiece_tokenizer.h"

namespace megaton::data {

Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  size_t colon = spec.find(':');
  std::string kind = spec.substr(0, colon), path = colon == std::string::npos ? "" : spec.substr(colon + 1);
  bool known = kind == "gpt2" || kind == "tiktoken" || kind == "sentencepiece";
  if (known && path.empty()) fail("tokenizer '", spec, "': expected ", kind, ":PATH");
  if (kind == "gpt2") return std::make_unique<BpeTokenizer>(load_gpt2_vocabulary(path), spec);
  if (kind == "tiktoken") return std::make_unique<BpeTokenizer>(load_tiktoken_vocabulary(path), spec);
  if (kind == "sentencepiece") return std::make_unique<SentencePieceTokenizer>(path, spec);
  fail("unknown tokenizer '", spec, "'; known: byte, gpt2:DIR (vocab.json + merges.txt), tiktoken:FILE, ",
       "sentencepiece:FILE.model");
}

}  // namespace megaton::data
