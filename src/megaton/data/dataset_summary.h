// What `megaton data inspect` reports about an indexed dataset: counts, sequence lengths and the token
// histogram's head, from one pass over every token.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "megaton/data/indexed_dataset.h"

namespace megaton::data {

struct DatasetSummary {
  DType dtype = DType::U16;
  int64_t sequences = 0, documents = 0, tokens = 0;
  int64_t min_length = 0, max_length = 0;  // sequence lengths in tokens (0 and 0 when there are none)
  double mean_length = 0;
  int64_t min_token = 0, max_token = 0, distinct_tokens = 0;
  std::vector<std::pair<int64_t, int64_t>> top_tokens;  // (id, count), most frequent first, ties by id
};

DatasetSummary summarize(const IndexedDataset& ds, size_t top);

}  // namespace megaton::data
