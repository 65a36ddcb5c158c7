// train_sentencepiece (declared in sentencepiece_tokenizer.h): SentencePieceTrainer with Megaton's defaults.
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <unordered_map>

#include "megaton/core/error.h"
#include "megaton/core/threads.h"
#include "megaton/data/sentencepiece_tokenizer.h"

namespace megaton::data {

void train_sentencepiece(const SentencePieceTrainOptions& opts) {
  if (opts.inputs.empty()) fail("tokenizer train: no input files");
  if (opts.type != "bpe" && opts.type != "unigram")
    fail("tokenizer train: --type must be bpe or unigram, got '", opts.type, "'");
  std::string inputs;
  for (const auto& f : opts.inputs) {
    if (!std::filesystem::is_regular_file(f)) fail("tokenizer train: input ", f, " is not a readable file");
    // The trainer takes its inputs as one comma-separated flag.
    if (f.find(',') != std::string::npos) fail("tokenizer train: input ", f, " has a comma in its name");
    inputs += (inputs.empty() ? "" : ",") + f;
  }
  std::unordered_map<std::string, std::string> args{
      {"input", inputs},
      {"model_prefix", opts.output_prefix},
      {"vocab_size", std::to_string(opts.vocab_size)},
      {"model_type", opts.type},
      {"num_threads", std::to_string(opts.threads > 0 ? opts.threads : num_threads())},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"byte_fallback", "true"},
  };
  for (const auto& kv : opts.trainer_args) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) fail("tokenizer train: trainer argument '", kv, "' is not KEY=VALUE");
    args[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  if (auto status = sentencepiece::SentencePieceTrainer::Train(args); !status.ok())
    fail("tokenizer train: ", status.ToString());
}

}  // namespace megaton::data
