#include "megaton/train/sample_order.h"

#include <numeric>

#include "megaton/core/error.h"
#include "megaton/core/rng.h"

namespace megaton::train {

SampleOrder::SampleOrder(int64_t num_samples, uint64_t seed, bool shuffle)
    : n_(num_samples), seed_(seed), shuffle_(shuffle) {
  if (n_ <= 0) fail("sample order over an empty dataset");
}

int64_t SampleOrder::at(int64_t g) {
  const int64_t epoch = g / n_;
  if (!shuffle_) return g % n_;
  if (epoch != epoch_) {
    // Fisher-Yates with a counter-based stream per epoch.
    perm_.resize(static_cast<size_t>(n_));
    std::iota(perm_.begin(), perm_.end(), 0);
    Philox rng(seed_, 0x5eed0000ull + static_cast<uint64_t>(epoch));
    for (int64_t i = n_ - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(rng.uniform_double(static_cast<uint64_t>(i)) * static_cast<double>(i + 1));
      std::swap(perm_[static_cast<size_t>(i)], perm_[static_cast<size_t>(std::min(j, i))]);
    }
    epoch_ = epoch;
  }
  return perm_[static_cast<size_t>(g % n_)];
}

}  // namespace megaton::train
