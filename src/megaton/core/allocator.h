// One allocator per device (the host, each CUDA device), each counting live and peak bytes per
// category. The planner's memory model is checked against these counters, so every Tensor
// allocation goes through here. A CUDA device's memory comes through a caching pool
// (core/caching_pool.h): freed blocks are kept for reuse instead of going back to cudaFree;
// MEGATON_CUDA_CACHING=0 in the environment turns it off (each tensor its own cudaMalloc, as
// compute-sanitizer wants to see out-of-bounds accesses).
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <string_view>

#include "megaton/core/device.h"

namespace megaton {

enum class MemCategory : uint8_t { Params, Grads, Optimizer, Activations, Workspace, Other };
inline constexpr size_t kNumMemCategories = 6;
std::string_view mem_category_name(MemCategory c);

struct MemStats {
  std::array<size_t, kNumMemCategories> live{};
  std::array<size_t, kNumMemCategories> peak{};
  size_t total_live = 0;
  size_t total_peak = 0;
  // Bytes allocated since the last reset_peaks(), whatever was freed since: how much an op writes
  // into fresh tensors (a fused op's saving shows here even where the peak does not move).
  std::array<size_t, kNumMemCategories> allocated{};
  // Bytes held from the device: live tensors (rounded to their blocks) plus the cache; on the host
  // and without the pool equal to total_live. cached: the pool's free blocks.
  size_t reserved = 0;
  size_t cached = 0;
};

class CachingPool;
class MemorySource;

class Allocator {
 public:
  static Allocator& host();
  // The allocator of `device`; throws naming the device when this build has no backend for it
  // (cuda without CUDA) or the ordinal is out of range.
  static Allocator& of(Device device);
  Device device() const { return device_; }
  // 64-byte aligned (256 on CUDA), uninitialised. Throws megaton::Error (naming `what` and the
  // device) when out of memory.
  void* allocate(size_t bytes, MemCategory cat, std::string_view what);
  void deallocate(void* p, size_t bytes, MemCategory cat);
  MemStats stats() const;
  void reset_peaks();  // also restarts the `allocated` counts
  // Hands the free blocks back: the caching pool's to the device, the C library's to the system (host).
  void empty_cache();

 private:
  explicit Allocator(Device device);
  Device device_;
  std::unique_ptr<MemorySource> source_;  // CUDA devices with caching on
  std::unique_ptr<CachingPool> pool_;
  std::array<std::atomic<size_t>, kNumMemCategories> live_{};
  std::array<std::atomic<size_t>, kNumMemCategories> peak_{};
  std::array<std::atomic<size_t>, kNumMemCategories> allocated_{};
  std::atomic<size_t> total_live_{0};
  std::atomic<size_t> total_peak_{0};
};

}  // namespace megaton
