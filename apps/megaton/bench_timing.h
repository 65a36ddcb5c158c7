// Timing helpers shared by `megaton bench`'s kernel-level modes (--gemm-shapes, --fusion-kernels).
#pragma once
#include <algorithm>
#include <chrono>
#include <vector>

#include "megaton/core/rng.h"
#include "megaton/core/tensor.h"

namespace megaton::app {

// Median seconds per call: `repeats` samples after one warm-up sample, each `calls` back-to-back
// calls followed by a wait for the device (device work is queued; the host clock only sees it
// once synchronized).
template <typename F>
double median_seconds(Device device, int repeats, int calls, F&& f) {
  std::vector<double> t;
  for (int r = 0; r <= repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) f();
    synchronize(device);
    if (r > 0) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls);
  }
  std::nth_element(t.begin(), t.begin() + static_cast<int64_t>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

// Uniform values in [-1, 1) (never constants or zeros: those can run faster than real data).
inline Tensor random_tensor(Shape shape, DType dtype, Device device, uint64_t seed, const char* name) {
  Tensor host = Tensor::empty(std::move(shape), DType::F32, MemCategory::Workspace, name);
  Philox rng(seed);
  for (int64_t i = 0; i < host.numel(); ++i)
    host.data<float>()[i] = static_cast<float>(2.0 * rng.uniform_double(static_cast<uint64_t>(i)) - 1.0);
  Tensor t = host.to(dtype, MemCategory::Workspace).to(device, MemCategory::Workspace);
  t.set_name(name);
  return t;
}

}  // namespace megaton::app
