// Splits preprocessing inputs into documents: JSON Lines (.json/.jsonl: one document per line, decoded
// later so that decoding runs in parallel) or plain text (the whole file is one document, or, with a
// separator, every block between lines equal to it is).
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

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
  uint64_t bytes_read() const { return bytes_; }

  // Replaces batch with the next whole documents, stopping once about max_bytes of input were read;
  // returns false when the input is exhausted. Blank JSON lines and empty text blocks yield nothing.
  bool next_batch(std::vector<RawDocument>& batch, size_t max_bytes);

 private:
  bool is_separator(const std::string& line) const;

  std::string path_;
  std::string separator_;
  bool json_;
  std::ifstream in_;
  int64_t line_no_ = 0;
  uint64_t bytes_ = 0;
  RawDocument current_;  // the plain-text document being gathered, possibly across batches
  bool in_document_ = false;
};

}  // namespace megaton::data
