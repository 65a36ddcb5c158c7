#include "megaton/ckpt/manifest.h"

// xxHash used header-only (libxxhash-dev): the one function we need inlines, nothing to link.
// GCC 12 misreads its AVX-512 intrinsics as maybe-uninitialized under -march=native.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define XXH_INLINE_ALL
#include <xxhash.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "megaton/core/atomic_file.h"
#include "megaton/core/error.h"
#include "megaton/core/json_integer.h"
#include "megaton/core/regular_file.h"

namespace megaton::ckpt {

namespace fs = std::filesystem;

namespace {

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016lx", static_cast<unsigned long>(v));
  return buf;
}

struct StateFree {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};
struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

FileDigest digest_file(const std::string& path) {
  std::unique_ptr<std::FILE, FileCloser> f(fopen_regular_file(path, "checkpoint file"));
  std::unique_ptr<XXH3_state_t, StateFree> state(XXH3_createState());
  if (!state || XXH3_64bits_reset(state.get()) != XXH_OK) fail("cannot start hashing ", path);
  std::vector<char> buf(size_t{4} << 20);
  FileDigest d{fs::path(path).filename().string(), 0, 0};
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0;) {
    XXH3_64bits_update(state.get(), buf.data(), n);
    d.bytes += n;
  }
  if (std::ferror(f.get())) fail("cannot read ", path, ": ", std::strerror(errno));
  d.xxh3 = XXH3_64bits_digest(state.get());
  return d;
}

void write_manifest(const std::string& dir, const std::vector<FileDigest>& known) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != kManifestName) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  nlohmann::ordered_json files = nlohmann::ordered_json::object();
  for (const std::string& name : names) {
    const auto k = std::find_if(known.begin(), known.end(), [&](const FileDigest& d) { return d.name == name; });
    const FileDigest d = k != known.end() ? *k : digest_file((fs::path(dir) / name).string());
    files[name] = {{"bytes", d.bytes}, {"xxh3_64", hex64(d.xxh3)}};
  }
  const std::string text = nlohmann::ordered_json{{"format", "megaton-checkpoint"}, {"files", files}}.dump(2) + "\n";
  write_file_atomically((fs::path(dir) / kManifestName).string(), text);
}

void verify_manifest(const std::string& dir) {
  const fs::path path = fs::path(dir) / kManifestName;
  if (!fs::exists(path)) fail(dir, ": no ", kManifestName, " (incomplete checkpoint)");
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(read_regular_file(path.string(), "checkpoint manifest"));
    if (!manifest.at("files").is_object()) fail(path.string(), ": \"files\" is not an object");
  } catch (const nlohmann::json::exception& e) {
    fail(path.string(), ": corrupt manifest: ", e.what());
  }
  for (const auto& [name, entry] : manifest["files"].items()) {
    // Only files of the checkpoint itself: a name with a path in it would make loading read (and hash)
    // anything the manifest names, an absolute path replacing the directory altogether.
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
      fail(path.string(), ": entry '", name, "' is not a file name inside the checkpoint directory");
    const fs::path file = fs::path(dir) / name;
    if (!fs::exists(file)) fail(file.string(), ": missing (listed in ", kManifestName, ")");
    const FileDigest d = digest_file(file.string());
    uint64_t bytes = 0;
    std::string want;
    try {
      bytes = json_uint64(entry.at("bytes"), path.string() + ": '" + name + "' bytes");
      want = entry.at("xxh3_64").get<std::string>();
    } catch (const nlohmann::json::exception& e) {
      fail(path.string(), ": corrupt entry for '", name, "': ", e.what());
    }
    if (d.bytes != bytes) fail(file.string(), ": ", d.bytes, " bytes, the manifest says ", bytes, " (truncated?)");
    if (hex64(d.xxh3) != want)
      fail(file.string(), ": checksum mismatch (xxh3_64 ", hex64(d.xxh3), ", the manifest says ", want, ")");
  }
}

}  // namespace megaton::ckpt
