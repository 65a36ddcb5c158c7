// Tokenizes text corpora into a Megatron indexed dataset (PREFIX.bin/.idx), like Megatron-LM's
// tools/preprocess_data.py without sentence splitting: one sequence per document.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace megaton::data {

struct PreprocessOptions {
  std::vector<std::string> inputs;  // .json/.jsonl: JSON Lines; anything else: plain text
  std::string output_prefix;
  std::string tokenizer = "byte";  // a make_tokenizer spec
  std::string json_key = "text";   // JSON Lines: the field holding the document text
  bool append_eod = false;         // end every non-empty document with the tokenizer's eod id
  // Plain text: if non-empty, a line equal to it separates documents (fortune files use "%"); else each
  // file is one document.
  std::string doc_separator;
  int workers = 0;       // tokenizing threads; <= 0: the process-wide thread count
  bool progress = true;  // progress bar on stderr
};

struct PreprocessStats {
  int64_t documents = 0;  // documents written; those with no tokens are skipped
  int64_t tokens = 0;
  int64_t bytes = 0;  // input bytes read
  double seconds = 0;
};

// Errors in the input name FILE:LINE; on any error nothing is left at the output prefix.
PreprocessStats preprocess(const PreprocessOptions& opts);

}  // namespace megaton::data
