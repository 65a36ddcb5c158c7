// Tokenizes text corpora into a Megatron indexed dataset (PREFIX.bin/.idx), like Megatron-LM's
// tools/preprocess_data.py without sentence splitting: one sequence per document.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "megaton/core/dtype.h"

namespace megaton::data {

constexpr int kMaxPreprocessWorkers = 1024;

struct PreprocessOptions {
  // .json/.jsonl: JSON Lines; anything else: plain text. Each may be gzip or zstd compressed (the format is
  // told by its magic bytes; a .gz / .zst suffix is ignored when telling JSON Lines from text).
  std::vector<std::string> inputs;
  std::string output_prefix;
  std::string tokenizer = "byte";  // a make_tokenizer spec
  std::string json_key = "text";   // JSON Lines: the field holding the document text
  bool append_eod = false;         // end every non-empty document with the tokenizer's eod id
  // Plain text: if non-empty, a line equal to it separates documents (fortune files use "%"); else each
  // file is one document.
  std::string doc_separator;
  // JSON Lines: count and drop lines that are not a JSON object with a string field json_key, instead of
  // stopping at the first one with an error naming FILE:LINE.
  bool skip_bad_lines = false;
  int workers = 0;       // tokenizing threads, at most kMaxPreprocessWorkers; 0: the process-wide thread count
  bool progress = true;  // progress bar on stderr
};

struct PreprocessStats {
  int64_t documents = 0;  // documents written; those with no tokens are skipped
  int64_t tokens = 0;
  int64_t bytes = 0;  // input bytes read (decompressed)
  double seconds = 0;
  DType dtype = DType::U16;   // token dtype of the output
  int64_t skipped_lines = 0;  // malformed JSON lines dropped under skip_bad_lines
  std::string first_skipped;  // "FILE:LINE: what" of the first of them
};

// Errors in the input name FILE:LINE; on any error nothing is left at the output prefix: the dataset is
// written under temporary names and renamed into place only once complete.
PreprocessStats preprocess(const PreprocessOptions& opts);

}  // namespace megaton::data
