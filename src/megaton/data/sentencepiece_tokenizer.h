// SentencePiece models (.model files from spm_train, Llama 1/2, T5, ...) through libsentencepiece, and
// training new ones with the library's trainer.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "megaton/data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace megaton::data {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // Loads `model_path`; the model must define an end-of-sentence piece, which is the eod (as in
  // Megatron's SentencePiece tokenizers).
  SentencePieceTokenizer(const std::string& model_path, std::string spec);
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  // Control pieces (<s>, </s>) decode to nothing, unknown ids (<unk>) to " \u2047 ", as spm_decode does.
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override;
  int32_t eod() const override;
  std::string spec() const override { return spec_; }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string spec_;
};

struct SentencePieceTrainOptions {
  std::vector<std::string> inputs;  // plain text, one sentence per line
  std::string output_prefix;        // writes PREFIX.model and PREFIX.vocab
  int vocab_size = 8000;
  std::string type = "unigram";  // or "bpe"
  // Extra trainer flags as spm_train spells them ("character_coverage=1.0"); they override the defaults.
  std::vector<std::string> trainer_args;
  int threads = 0;  // <= 0: the process-wide thread count
};

// Trains with SentencePieceTrainer. Defaults differ from spm_train's so that decode(encode(x)) == x for
// any valid UTF-8 (Llama's choice): identity normalization, spaces kept as they are, and byte fallback
// for characters outside the vocabulary (the 256 byte pieces count toward vocab_size).
void train_sentencepiece(const SentencePieceTrainOptions& opts);

}  // namespace megaton::data
