// What every harness shares: the fuzz input written to scratch files (most parsers read a path, as
// they do in the CLI) and split into several files where a format has more than one.
#pragma once
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "megaton/core/error.h"

namespace megaton::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs a parser on hostile bytes. Rejecting them with megaton::Error (a message naming the file and
// what is wrong) is the expected way out; a crash, a sanitizer report, a hang or any other exception
// escaping (a library's own message, naming no file) is a finding.
template <typename F>
void parse_or_reject(F&& parse) {
  try {
    parse();
  } catch (const Error&) {
  }
}

// A property of accepted input that does not hold: abort, which libFuzzer reports with the input.
inline void require(bool ok) {
  if (!ok) __builtin_trap();
}

// A directory of this process's own, made on first use and removed at exit.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::string tmpl = (std::filesystem::temp_directory_path() / "megaton_fuzz_XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    std::atexit([] { std::filesystem::remove_all(scratch_dir()); });
    return std::filesystem::path(tmpl);
  }();
  return dir;
}

// Writes bytes to scratch_dir()/name (replacing what was there) and returns the path.
inline std::string write_scratch(const std::string& name, std::string_view bytes) {
  const std::filesystem::path path = scratch_dir() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
  return path.string();
}

// Inputs holding several files (vocab.json and merges.txt, .idx and .bin) separate them with this
// line; missing parts are empty. The seed corpora use it too.
inline constexpr std::string_view kPartSeparator = "\n--megaton-fuzz-part--\n";

inline std::vector<std::string_view> split_parts(const uint8_t* data, size_t size, size_t parts) {
  std::string_view rest = as_text(data, size);
  std::vector<std::string_view> out;
  for (size_t i = 0; i + 1 < parts; ++i) {
    const size_t at = rest.find(kPartSeparator);
    out.push_back(rest.substr(0, at));
    rest = at == std::string_view::npos ? std::string_view{} : rest.substr(at + kPartSeparator.size());
  }
  out.push_back(rest);
  return out;
}

}  // namespace megaton::fuzz
