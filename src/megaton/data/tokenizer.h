// Text <-> token ids. Preprocessing and sampling only see this interface; make_tokenizer builds one from
// a spec string, which is also stored with datasets and checkpoints to say how their ids were made.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace megaton::data {

class Tokenizer {
 public:
  virtual ~Tokenizer();
  // encode and decode are const and must be safe to call from several threads at once.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t eod() const = 0;  // end-of-document id, appended between documents
  virtual std::string spec() const = 0;
};

// Specs: "byte", "gpt2:DIR" (DIR/vocab.json + DIR/merges.txt), "tiktoken:FILE" (a .tiktoken rank file),
// "sentencepiece:FILE.model". Unknown specs are an error listing them; missing or malformed files are
// errors naming the file (and line).
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec);

}  // namespace megaton::data
