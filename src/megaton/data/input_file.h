// A preprocessing input read as a stream of decompressed bytes: plain, gzip (.gz, also concatenated
// members) or zstd (.zst, also concatenated frames). The format is told by the file's magic bytes, not
// its name, so a mislabelled file still reads correctly; the name only decides JSON Lines vs text.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace megaton::data {

enum class Compression { kNone, kGzip, kZstd };

class InputFile {
 public:
  explicit InputFile(std::string path);  // throws naming an unreadable file
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  // Up to n decompressed bytes into buf; 0 only at the end of the input. A corrupt or truncated
  // compressed stream is an error naming the file.
  size_t read(char* buf, size_t n);

  Compression compression() const { return compression_; }
  const std::string& path() const { return path_; }
  // Bytes of the file on disk consumed so far (compressed bytes for compressed inputs): progress and ETA
  // are measured against file sizes.
  uint64_t disk_bytes_read() const { return disk_bytes_; }

  class Decoder;  // gzip or zstd state, defined in the .cpp

 private:
  size_t read_raw(char* buf, size_t n);

  std::string path_;
  std::FILE* file_ = nullptr;
  Compression compression_ = Compression::kNone;
  uint64_t disk_bytes_ = 0;
  std::unique_ptr<Decoder> decoder_;
};

// The file name without a trailing .gz / .zst, so "corpus.jsonl.zst" is recognised as JSON Lines.
std::string name_without_compression_suffix(const std::string& path);

}  // namespace megaton::data
