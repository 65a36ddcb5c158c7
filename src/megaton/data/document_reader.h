// Splits preprocessing inputs into documents: JSON Lines (.json/.jsonl: one document per line, decoded
// later so that decoding runs in parallel) or plain text (the whole file is one document, or, with a
// separator, every block between lines equal to it is). Inputs may be gzip or zstd compressed
// (corpus.jsonl.gz, corpus.jsonl.zst).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "megaton/data/input_file.h"

namespace megaton::data {

struct RawDocument {
  std::string text;  // JSON Lines: the undecoded line; plain text: the document itself
  int64_t line = 0;  // 1-based line the document starts on, for FILE:LINE errors
};

class DocumentReader {
 public:
  DocumentReader(std::string path, std::string doc_separator);  // throws naming an unreadable file

  bool is_json_lines() const { return json_; }
  const std::string& path() const { return path_; }
  uint64_t bytes_read() const { return bytes_; }  // decompressed
  uint64_t disk_bytes_read() const { return in_.disk_bytes_read(); }

  // Replaces batch with the next whole documents, stopping once about max_bytes of input were read;
  // returns false when the input is exhausted. Blank JSON lines and empty text blocks yield nothing.
  bool next_batch(std::vector<RawDocument>& batch, size_t max_bytes);

 private:
  bool is_separator(const std::string& line) const;
  // The next line without its '\n' into line; sets newline when one ended it. False at the end.
  bool getline(std::string& line, bool& newline);

  std::string path_;
  std::string separator_;
  bool json_;
  InputFile in_;
  std::vector<char> buf_;  // decompressed bytes [buf_pos_, buf_len_) not yet split into lines
  size_t buf_pos_ = 0, buf_len_ = 0;
  int64_t line_no_ = 0;
  uint64_t bytes_ = 0;
  RawDocument current_;  // the plain-text document being gathered, possibly across batches
  bool in_document_ = false;
};

}  // namespace megaton::data
