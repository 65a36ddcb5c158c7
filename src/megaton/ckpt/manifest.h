// A checkpoint's manifest.json: the byte size and xxHash (XXH3-64) of every file in the
// checkpoint directory, written last. Loading verifies each file against it, so a truncated,
// bit-flipped or half-written checkpoint is caught before any of it reaches the model.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace megaton::ckpt {

inline constexpr const char* kManifestName = "manifest.json";

struct FileDigest {
  std::string name;  // file name inside the checkpoint directory
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
};

// Size and XXH3-64 of one file, read in full; the error names the file.
FileDigest digest_file(const std::string& path);

// Digests every regular file in `dir` and writes DIR/manifest.json atomically. Files named in
// `known` take the digest given there (their writer computed it) instead of being read again.
void write_manifest(const std::string& dir, const std::vector<FileDigest>& known = {});

// Checks every file the manifest lists (present, same size, same checksum) and that the manifest
// itself parses. Throws an Error naming the directory and the first file at fault.
void verify_manifest(const std::string& dir);

}  // namespace megaton::ckpt
