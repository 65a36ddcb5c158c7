#include "megaton/core/device.h"

#include <charconv>

#include "megaton/core/error.h"
#ifdef MEGATON_WITH_CUDA
#include "megaton/core/cuda/cuda_memory.h"
#endif

namespace megaton {

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  constexpr std::string_view prefix = "cuda:";
  if (text.substr(0, prefix.size()) == prefix) {
    const std::string_view digits = text.substr(prefix.size());
    int index = -1;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && !digits.empty() && index >= 0 &&
        index < kMaxCudaDevices)
      return cuda(index);
  }
  fail("unknown device '", text, "': expected cpu, cuda or cuda:N with 0 <= N < ", kMaxCudaDevices);
}

void synchronize(Device device) {
  if (device.is_cpu()) return;
#ifdef MEGATON_WITH_CUDA
  cuda::synchronize(device.index);
#else
  fail("synchronize on ", device.str(), ": this Megaton was built without CUDA");
#endif
}

}  // namespace megaton
