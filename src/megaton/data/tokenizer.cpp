#include "megaton/data/tokenizer.h"

#include "megaton/core/error.h"
#include "megaton/data/byte_tokenizer.h"

namespace megaton::data {

Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  for (std::string_view planned : {"gpt2:", "tiktoken:", "sentencepiece:"})
    if (spec.starts_with(planned))
      fail("tokenizer '", spec, "': ", planned.substr(0, planned.size() - 1),
           " tokenizers are not built yet; available: byte");
  fail("unknown tokenizer '", spec,
       "'; available: byte (planned, not built yet: gpt2:DIR, tiktoken:FILE, sentencepiece:FILE.model)");
}

}  // namespace megaton::data
