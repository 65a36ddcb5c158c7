// Output files that appear complete or not at all: bytes go to PATH.<pid>.tmp, and commit() fsyncs and renames
// it to PATH. Checkpoints and datasets are read by later runs, so a crash or an exception while writing
// must never leave a truncated file under the real name.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace megaton {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);  // opens PATH.<pid>.tmp; throws naming it
  ~AtomicFile();                          // removes the temporary unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  // Flush, fsync, rename onto path() and fsync the directory so the rename itself survives a crash.
  void commit();

  const std::string& path() const { return path_; }
  uint64_t bytes_written() const { return written_; }

 private:
  std::string path_;
  std::string tmp_;
  std::FILE* file_ = nullptr;
  uint64_t written_ = 0;
  bool committed_ = false;
};

// The whole of `text` as PATH, through an AtomicFile: small files (configs, indexes, manifests)
// written in one go.
void write_file_atomically(const std::string& path, std::string_view text);

// Removes the PATH.<pid>.tmp files in DIR (not below it) whose writing process no longer exists:
// what a process killed between opening and committing an AtomicFile leaves. A live process's
// temporaries (this one's included) may still be committed, so they stay. Returns the removed paths.
std::vector<std::string> remove_abandoned_temporaries(const std::string& dir);

}  // namespace megaton
