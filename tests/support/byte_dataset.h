// A small byte-level Megatron dataset with learnable structure (documents built from a handful of
// words), so a model visibly learns within a few steps.
#pragma once
#include <string>
#include <vector>

#include "megaton/core/rng.h"
#include "megaton/data/indexed_dataset.h"

namespace megaton::testing {

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

}  // namespace megaton::testing
