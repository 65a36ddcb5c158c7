#include "megaton/data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include "megaton/core/error.h"
#include "megaton/core/regular_file.h"

namespace megaton::data {

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path, std::string spec)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()), spec_(std::move(spec)) {
  if (auto status = sp_->LoadFromSerializedProto(read_regular_file(model_path, "SentencePiece model")); !status.ok())
    fail("cannot load SentencePiece model ", model_path, ": ", status.ToString());
  if (sp_->eos_id() < 0)
    fail("SentencePiece model ", model_path,
         " has no end-of-sentence piece (eos_id < 0); Megaton needs it as the end-of-document id");
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  if (auto status = sp_->Encode(text, &ids); !status.ok()) fail("tokenizer ", spec_, ": ", status.ToString());
  return {ids.begin(), ids.end()};
}

std::string SentencePieceTokenizer::decode(std::span<const int32_t> ids) const {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab_size())
      fail("tokenizer ", spec_, ": id ", ids[i], " at position ", i, " is not in the vocabulary (", vocab_size(),
           " ids)");
  std::string text;
  if (auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text); !status.ok())
    fail("tokenizer ", spec_, ": ", status.ToString());
  return text;
}

int64_t SentencePieceTokenizer::vocab_size() const { return sp_->GetPieceSize(); }

int32_t SentencePieceTokenizer::eod() const { return sp_->eos_id(); }

}  // namespace megaton::data
