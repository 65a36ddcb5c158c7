// The safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON header naming
// each tensor's dtype, shape and byte range, then the raw little-endian tensor bytes. Checkpoints use
// it so that other tools (PyTorch, safetensors, transformers) can read them without Megaton.
#pragma once
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "megaton/core/mapped_file.h"
#include "megaton/core/tensor.h"

namespace megaton::ckpt {

// Writes the tensors in the given order (names must be unique) with an optional "__metadata__" string
// map. Goes through path + ".tmp", fsync and rename: on failure nothing half-written is left at path.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads every tensor (MemCategory::Other, named for its key) and, if asked, the metadata. The header is
// validated against the file: errors name the file and, where one is at fault, the tensor.
std::map<std::string, Tensor> load_safetensors(const std::string& path,
                                               std::map<std::string, std::string>* metadata = nullptr);

// One file open for reading tensors one at a time (a sharded checkpoint's loader takes only the
// pieces it needs): the header is read and validated as load_safetensors does, the data is read on
// demand. Errors name the file and the tensor.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(std::string path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  DType dtype(const std::string& name) const;
  const Shape& shape(const std::string& name) const;
  std::vector<std::string> names() const;  // in data order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // A copy of the tensor's bytes in memory of its own.
  Tensor read(const std::string& name, MemCategory cat = MemCategory::Other) const;
  // The tensor's bytes where they lie in the file, mapped copy-on-write (core/mapped_file.h): nothing
  // read or cleared now, pages come in as they are first touched. A tensor whose bytes are not aligned
  // to its element size (a file from another writer) comes back as a copy. The file must not be
  // truncated while mapped tensors live (a touch past its new end is SIGBUS): for weights loaded to
  // serve, not for checkpoints that training later overwrites.
  Tensor map(const std::string& name, MemCategory cat = MemCategory::Other) const;
  // The mapping map()'s tensors view (null before the first map()).
  std::shared_ptr<const MappedFile> mapping() const { return mapping_; }

 private:
  struct Entry {
    DType dtype;
    Shape shape;
    uint64_t begin, end;
  };
  const Entry& entry(const std::string& name) const;

  std::string path_;
  std::FILE* file_ = nullptr;
  uint64_t file_bytes_ = 0, data_start_ = 0;
  mutable std::shared_ptr<MappedFile> mapping_;  // made on the first map()
  std::map<std::string, Entry> entries_;
  std::vector<std::string> order_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace megaton::ckpt
