#include "megaton/data/sample_source.h"

#include <algorithm>
#include <vector>

namespace megaton::data {

void read_batch(const SampleSource& source, int64_t first, int64_t B, int32_t* inputs, int32_t* targets) {
  const int64_t T = source.seq_length();
  std::vector<int32_t> tokens(static_cast<size_t>(T + 1));
  for (int64_t b = 0; b < B; ++b) {
    source.read(first + b, tokens.data());
    std::copy_n(tokens.begin(), T, inputs + b * T);
    std::copy_n(tokens.begin() + 1, T, targets + b * T);
  }
}

}  // namespace megaton::data
