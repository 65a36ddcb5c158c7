// Read-only memory map of a whole file. Token data is mapped rather than read so that a dataset larger
// than RAM costs only page cache, shared between processes reading the same file. Reads of a map that
// lives as long as a training run go through catch_sigbus (sigbus_guard.h), reporting a fault with
// fail_changed(): the file may be truncated while mapped.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace megaton::data {

class MappedFile {
 public:
  MappedFile() = default;
  // `what` describes the file in errors ("index file", ...); a missing file or one that is not a regular
  // file (a FIFO, a device, a directory) is an error naming the path.
  MappedFile(std::string path, std::string_view what);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  bool contains(const void* p) const {
    return data_ && static_cast<const uint8_t*>(p) >= data_ && static_cast<const uint8_t*>(p) < data_ + size_;
  }
  // The error for a read of this map that faulted (SIGBUS): names the file and its size then and now.
  [[noreturn]] void fail_changed() const;

 private:
  std::string path_;
  std::string what_;
  const uint8_t* data_ = nullptr;  // null for an empty file, which mmap cannot map
  size_t size_ = 0;
};

}  // namespace megaton::data
