// The safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON header naming
// each tensor's dtype, shape and byte range, then the raw little-endian tensor bytes. Checkpoints use
// it so that other tools (PyTorch, safetensors, transformers) can read them without Megaton.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

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

}  // namespace megaton::ckpt
