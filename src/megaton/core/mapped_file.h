// A regular file mapped into memory, copy-on-write: its pages are the page cache's (shared with
// every process reading the file, never cleared or copied at start-up, dropped under memory pressure
// and read back on demand), and a write into them makes a private copy of that page, so nothing a
// process does to a mapped tensor reaches the file. Inference weights stored in the dtype and layout
// the run uses are views of such a mapping (ckpt::SafetensorsReader::map), as llama.cpp and
// safetensors' safe_open do.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace megaton {

class MappedFile {
 public:
  // Maps the whole of the non-empty file open as `fd` (kept open by the caller; the mapping does not
  // need it after) and asks the kernel to start reading it ahead; `what` and `path` name it in errors.
  // Should the file shrink while mapped, a read past its new end ends the process with an error
  // naming it (exit status 1) instead of a bare SIGBUS.
  static std::shared_ptr<MappedFile> of_descriptor(int fd, const std::string& path, std::string_view what);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  MappedFile(char* data, size_t size, int slot) : data_(data), size_(size), slot_(slot) {}
  char* data_;
  size_t size_;
  int slot_;  // its entry in the SIGBUS handler's table, or -1
};

}  // namespace megaton
