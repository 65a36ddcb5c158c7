#include "megaton/data/numpy_random.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

using megaton::data::NumpyRandomState;

// Expected values printed by numpy 1.24 (Debian's python3-numpy):
//   x = np.arange(10, dtype=np.int32); np.random.RandomState(1234).shuffle(x)
//   np.random.RandomState(5).randint(0, 1000, size=4, dtype=np.int64)   # masked rejection, 32-bit draws
//   np.random.RandomState(5).randint(0, 2**40, size=4, dtype=np.int64)  # masked rejection, 64-bit draws
// tests/python/test_gpt_dataset_reference.py compares whole sampling indices with numpy itself.
TEST(NumpyRandom, ShuffleMatchesRandomState) {
  std::vector<int32_t> x(10);
  std::iota(x.begin(), x.end(), 0);
  NumpyRandomState rng(1234);
  rng.shuffle(std::span(x));
  EXPECT_EQ(x, (std::vector<int32_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
}

TEST(NumpyRandom, IntervalMatchesMaskedRejectionIn32And64Bits) {
  NumpyRandomState small(5);
  for (uint64_t want : {867, 206, 701, 998}) EXPECT_EQ(small.interval(999), want);
  NumpyRandomState large(5);
  for (uint64_t want : {425438759118ull, 1030067709629ull, 989404716150ull, 622681974857ull})
    EXPECT_EQ(large.interval((uint64_t{1} << 40) - 1), want);
  EXPECT_EQ(large.interval(0), 0u);
}
