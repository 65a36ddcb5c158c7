// All documents of an indexed dataset as one concatenated token stream, and the fixed-length
// samples cut from it: sample i is tokens [i*T, i*T + T] (T + 1 tokens: inputs are the first T,
// labels the last T), the GPT-2 / nanoGPT convention `megaton eval` documents.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "megaton/data/indexed_dataset.h"

namespace megaton::data {

class TokenStream {
 public:
  explicit TokenStream(const std::string& prefix);
  int64_t size() const { return starts_.back(); }
  // tokens [start, start + n) of the stream into out.
  void read(int64_t start, int64_t n, int32_t* out) const;
  // Number of complete (T + 1)-token samples.
  int64_t num_samples(int64_t T) const { return size() > T ? (size() - 1) / T : 0; }
  // Largest token id among the first `limit` tokens (to catch vocab mismatches early).
  int32_t max_token(int64_t limit) const;
  const IndexedDataset& dataset() const { return ds_; }

 private:
  IndexedDataset ds_;
  std::vector<int64_t> starts_;  // stream offset of each sequence, plus the total at the end
};

// Fills inputs/targets [B, T] with samples ids[0..B) of the stream.
void read_samples(const TokenStream& stream, const int64_t* ids, int64_t B, int64_t T, int32_t* inputs,
                  int32_t* targets);

}  // namespace megaton::data
