// Where a tensor's storage lives: the host (cpu) or one CUDA device (cuda:N). Every Tensor has a
// Device; kernels dispatch on it, and each device has its own accounting allocator.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace megaton {

enum class DeviceType : uint8_t { Cpu, Cuda };

struct Device {
  DeviceType type = DeviceType::Cpu;
  int index = 0;  // CUDA ordinal; 0 for the cpu

  static constexpr Device cpu() { return {DeviceType::Cpu, 0}; }
  static constexpr Device cuda(int index) { return {DeviceType::Cuda, index}; }
  bool is_cpu() const { return type == DeviceType::Cpu; }
  bool is_cuda() const { return type == DeviceType::Cuda; }
  bool operator==(const Device&) const = default;

  std::string str() const;  // "cpu", "cuda:0"
  // Parses "cpu", "cuda" (= cuda:0) and "cuda:N"; throws megaton::Error naming the text otherwise.
  static Device parse(std::string_view text);
};

// Waits until all work queued on `device` has finished (a no-op on the cpu, whose kernels return
// when done). Host timers around device work need it; kernels themselves never do.
void synchronize(Device device);

// Upper bound on CUDA ordinals Megaton keeps per-device state for (allocators).
inline constexpr int kMaxCudaDevices = 16;

}  // namespace megaton
