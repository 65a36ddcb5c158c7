// Opening input files that must be regular files. A FIFO, device or directory given where a model,
// tokenizer, config or dataset file belongs would otherwise block in open() or read() (a FIFO with no
// writer, /dev/zero) or fail later with a misleading message; here it is one error naming the file and
// what it is. Every reader of outside files opens them through these.
#pragma once
#include <cstdio>
#include <string>
#include <string_view>

namespace megaton {

// A file descriptor closed on destruction.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor();
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.release()) {}
  FileDescriptor& operator=(FileDescriptor&&) = delete;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

// Opens path read-only, checking that it is a regular file; `what` names it in errors ("index file",
// "model config", ...). Opened non-blocking, so that a FIFO without a writer is reported instead of
// waited on, and switched back to blocking reads once known to be a regular file.
FileDescriptor open_regular_file(const std::string& path, std::string_view what);

// The same as a stdio stream (the caller fcloses it).
std::FILE* fopen_regular_file(const std::string& path, std::string_view what);

// The whole file as bytes.
std::string read_regular_file(const std::string& path, std::string_view what);

}  // namespace megaton
