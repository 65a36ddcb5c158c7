// Shared test fixtures: temporary directories, small synthetic datasets, running the CLI.
#pragma once
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "megaton/core/rng.h"
#include "megaton/data/indexed_dataset.h"

namespace megaton::testing {

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    path_ = std::filesystem::temp_directory_path() /
            ("megaton_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::filesystem::path path_;
};

// Byte-level dataset of `docs` pseudo-random documents with some structure (repeated words),
// so that a model can learn something in a few steps.
inline void write_byte_dataset(const std::string& prefix, int docs, uint64_t seed = 3) {
  static const char* words[] = {"the ", "cat ", "sat ", "on ", "a ", "mat. ", "dogs ", "run ", "fast\n"};
  data::IndexedDatasetWriter w(prefix, DType::U16);
  Philox rng(seed);
  uint64_t k = 0;
  for (int d = 0; d < docs; ++d) {
    std::vector<int32_t> toks;
    const int n = 5 + static_cast<int>(rng.uniform(k++) * 30);
    for (int i = 0; i < n; ++i)
      for (const char* c = words[static_cast<int>(rng.uniform(k++) * 8.999f)]; *c; ++c) toks.push_back(*c);
    toks.push_back(256);
    w.add_document(toks);
  }
  w.finalize();
}

struct CommandResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

inline CommandResult run_command(const std::string& cmd) {
  CommandResult r{0, {}};
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace megaton::testing
