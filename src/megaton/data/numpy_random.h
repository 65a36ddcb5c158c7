// numpy.random.RandomState(seed).shuffle, bit for bit, so that Megatron's GPTDataset indices (built with
// it) come out identical here. RandomState seeded with an integer is MT19937 initialised by init_genrand,
// which is exactly std::mt19937(seed); shuffle is numpy's Fisher-Yates from the end, drawing each swap
// position with random_interval (mask to the next power of two minus one, redraw while above the bound).
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <utility>

namespace megaton::data {

class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}

  // numpy's random_interval: uniform in [0, max].
  uint64_t interval(uint64_t max);

  // numpy's RandomState.shuffle of a 1-D array.
  template <typename T>
  void shuffle(std::span<T> x) {
    for (size_t i = x.size(); i-- > 1;) std::swap(x[i], x[interval(i)]);
  }

 private:
  std::mt19937 mt_;
};

}  // namespace megaton::data
