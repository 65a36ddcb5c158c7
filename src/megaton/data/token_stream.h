// All documents of an indexed dataset as one concatenated token stream, and the fixed-length
// samples cut from it: sample i is tokens [i*T, i*T + T] (T + 1 tokens: inputs are the first T,
// labels the last T), the GPT-2 / nanoGPT convention `megaton eval` documents.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "megaton/data/indexed_dataset.h"
#include "megaton/data/sample_source.h"

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

// The stream's samples in order (sample i = tokens [i*T, i*T + T]) as a SampleSource: what
// `megaton eval` scores and what training reads with data.shuffle = false. With `size` larger
// than the number of complete samples the stream wraps around (epoch after epoch, same order).
class StreamSamples final : public data::SampleSource {
 public:
  StreamSamples(std::shared_ptr<const TokenStream> stream, int64_t seq_length, int64_t size = -1);
  int64_t size() const override { return size_; }
  int64_t seq_length() const override { return T_; }
  void read(int64_t i, int32_t* out) const override;

 private:
  std::shared_ptr<const TokenStream> stream_;
  int64_t T_, samples_, size_;
};

}  // namespace megaton::data
