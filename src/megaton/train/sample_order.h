// The order in which training samples are visited: epoch after epoch over [0, num_samples),
// each epoch a fresh permutation drawn from (seed, epoch) when shuffling, identity otherwise.
// Position g of the stream is therefore a pure function of (seed, g): resumable from any offset.
#pragma once
#include <cstdint>
#include <vector>

namespace megaton::train {

class SampleOrder {
 public:
  SampleOrder(int64_t num_samples, uint64_t seed, bool shuffle);
  int64_t at(int64_t g);  // sample id at stream position g (g >= 0)
  int64_t num_samples() const { return n_; }

 private:
  int64_t n_;
  uint64_t seed_;
  bool shuffle_;
  int64_t epoch_ = -1;
  std::vector<int64_t> perm_;
};

}  // namespace megaton::train
