// Test helpers for code that reads and writes files: a scratch directory removed afterwards, whole-file
// byte I/O for building and corrupting inputs, and the message of an expected megaton::Error.
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "megaton/core/error.h"

namespace megaton::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "megaton_test_XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return (path_ / name).string(); }
  // Names in the directory, to check that failed writes leave nothing (not even temporaries) behind.
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::filesystem::path path_;
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// The message of the megaton::Error that f throws; records a test failure if it throws none.
template <typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a megaton::Error";
  return {};
}

}  // namespace megaton::testing

// Expect that `statement` throws a megaton::Error whose message contains every one of the given strings.
#define EXPECT_ERROR_CONTAINS(statement, ...)                                                               \
  do {                                                                                                      \
    std::string megaton_msg_ = ::megaton::testing::error_message([&] { (void)(statement); });               \
    for (const std::string& part : std::initializer_list<std::string>{__VA_ARGS__})                         \
      EXPECT_NE(megaton_msg_.find(part), std::string::npos) << "'" << part << "' not in: " << megaton_msg_; \
  } while (0)
