// Host allocator that counts live and peak bytes per category. The planner's memory model is
// checked against these counters, so every Tensor allocation goes through here.
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <string_view>

namespace megaton {

enum class MemCategory : uint8_t { Params, Grads, Optimizer, Activations, Workspace, Other };
inline constexpr size_t kNumMemCategories = 6;
std::string_view mem_category_name(MemCategory c);

struct MemStats {
  std::array<size_t, kNumMemCategories> live{};
  std::array<size_t, kNumMemCategories> peak{};
  size_t total_live = 0;
  size_t total_peak = 0;
};

class Allocator {
 public:
  static Allocator& host();
  // 64-byte aligned, uninitialised. Throws megaton::Error (naming `what`) when out of memory.
  void* allocate(size_t bytes, MemCategory cat, std::string_view what);
  void deallocate(void* p, size_t bytes, MemCategory cat);
  MemStats stats() const;
  void reset_peaks();

 private:
  std::array<std::atomic<size_t>, kNumMemCategories> live_{};
  std::array<std::atomic<size_t>, kNumMemCategories> peak_{};
  std::atomic<size_t> total_live_{0};
  std::atomic<size_t> total_peak_{0};
};

}  // namespace megaton
