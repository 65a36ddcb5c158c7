// Counter-based RNG (Philox4x32-10, Salmon et al. 2011, the generator cuRAND and PyTorch use):
// the value at index i depends only on (seed, stream, i), so every rank and every thread count
// draws the same numbers.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

namespace megaton {

class Philox {
 public:
  explicit Philox(uint64_t seed, uint64_t stream = 0) : seed_(seed), stream_(stream) {}
  // Four 32-bit words for counter value `index`.
  std::array<uint32_t, 4> block(uint64_t index) const;
  // Uniform in (0, 1] / standard normal for element `index` of this stream.
  float uniform(uint64_t index) const;
  double uniform_double(uint64_t index) const;
  float normal(uint64_t index) const;
  uint64_t seed() const { return seed_; }
  uint64_t stream() const { return stream_; }

 private:
  uint64_t seed_;
  uint64_t stream_;
};

// out[i] = mean + stddev * N(0,1) drawn at index offset + i. Parallel, thread-count independent.
void fill_normal(float* out, int64_t n, const Philox& rng, float mean, float stddev, uint64_t offset = 0);
void fill_uniform(float* out, int64_t n, const Philox& rng, float lo, float hi, uint64_t offset = 0);

// Stable 64-bit hash of a string (FNV-1a), used to derive per-tensor RNG streams from names.
uint64_t stable_hash(const char* s, size_t n);

}  // namespace megaton
