#include "megaton/data/document_reader.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>

namespace megaton::data {

namespace {
constexpr size_t kReadBytes = 1 << 20;

bool has_json_lines_extension(const std::string& path) {
  std::string ext = std::filesystem::path(name_without_compression_suffix(path)).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".json" || ext == ".jsonl";
}

bool is_blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); });
}
}  // namespace

DocumentReader::DocumentReader(std::string path, std::string doc_separator)
    : path_(std::move(path)),
      separator_(std::move(doc_separator)),
      json_(has_json_lines_extension(path_)),
      in_(path_),
      buf_(kReadBytes) {}

bool DocumentReader::getline(std::string& line, bool& newline) {
  line.clear();
  for (;;) {
    if (buf_pos_ == buf_len_) {
      buf_len_ = in_.read(buf_.data(), buf_.size());
      buf_pos_ = 0;
      if (buf_len_ == 0) {
        newline = false;
        return !line.empty();
      }
    }
    const char* begin = buf_.data() + buf_pos_;
    const auto* end = static_cast<const char*>(std::memchr(begin, '\n', buf_len_ - buf_pos_));
    if (end) {
      line.append(begin, end);
      buf_pos_ += static_cast<size_t>(end - begin) + 1;
      newline = true;
      return true;
    }
    line.append(begin, buf_len_ - buf_pos_);
    buf_pos_ = buf_len_;
  }
}

// A trailing '\r' is ignored so that separators in files with Windows line endings still count.
bool DocumentReader::is_separator(const std::string& line) const {
  if (separator_.empty()) return false;
  std::string_view l = line;
  if (l.ends_with('\r')) l.remove_suffix(1);
  return l == separator_;
}

bool DocumentReader::next_batch(std::vector<RawDocument>& batch, size_t max_bytes) {
  batch.clear();
  uint64_t start = bytes_;
  std::string line;
  bool newline = false;
  while (getline(line, newline)) {
    ++line_no_;
    bytes_ += line.size() + newline;
    if (json_) {
      if (!is_blank(line)) batch.push_back({std::move(line), line_no_});
    } else if (is_separator(line)) {
      if (in_document_) batch.push_back(std::move(current_));
      in_document_ = false;
    } else {
      if (!in_document_) current_ = {{}, line_no_};
      in_document_ = true;
      current_.text += line;
      if (newline) current_.text += '\n';
    }
    if (bytes_ - start >= max_bytes && !in_document_) return true;
  }
  if (in_document_) batch.push_back(std::move(current_));
  in_document_ = false;
  return !batch.empty();
}

}  // namespace megaton::data
