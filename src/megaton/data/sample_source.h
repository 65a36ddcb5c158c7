// What the loader reads training samples from: a GptDataset (one dataset's split) or a BlendedDataset
// (several, mixed by weight). Sample i is seq_length() + 1 consecutive tokens: the inputs are the first
// seq_length(), the targets the last seq_length().
#pragma once
#include <cstdint>

namespace megaton::data {

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t size() const = 0;
  virtual int64_t seq_length() const = 0;
  // Writes the seq_length() + 1 tokens of sample i (0 <= i < size()) to out. Safe to call from several
  // threads at once.
  virtual void read(int64_t i, int32_t* out) const = 0;
};

// Samples first .. first + B - 1 of `source` as a batch: inputs and targets are [B, seq_length()]
// row-major, targets shifted by one token.
void read_batch(const SampleSource& source, int64_t first, int64_t B, int32_t* inputs, int32_t* targets);

}  // namespace megaton::data
