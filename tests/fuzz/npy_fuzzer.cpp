// libFuzzer harness: a .npy file, as the GPTDataset index caches are read back (memory-mapped).
#include <numeric>

#include "fuzz_input.h"
#include "megaton/data/npy_file.h"

namespace {
// Reads every element, so an accepted header that overstates the data faults here.
template <typename T>
void read_all(const megaton::data::NpyArray& a) {
  megaton::fuzz::parse_or_reject([&] {
    const auto v = a.values<T>();
    volatile T sum = std::accumulate(v.begin(), v.end(), T{0}, [](T x, T y) { return T(uint64_t(x) + uint64_t(y)); });
    (void)sum;
  });
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = megaton::fuzz::write_scratch("index.npy", megaton::fuzz::as_text(data, size));
  megaton::fuzz::parse_or_reject([&] {
    const megaton::data::NpyArray a(path);
    read_all<int32_t>(a);
    read_all<int64_t>(a);
  });
  return 0;
}
