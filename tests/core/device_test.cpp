// Devices: parsing, and tensors on a CUDA device failing cleanly where there is none.
#include "megaton/core/device.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "../support/temp_dir.h"
#include "megaton/core/allocator.h"
#include "megaton/core/tensor.h"
#ifdef MEGATON_WITH_CUDA
#include "megaton/core/cuda/cuda_memory.h"
#endif

using namespace megaton;

TEST(Device, ParsesCpuCudaAndOrdinals) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:7"), Device::cuda(7));
  EXPECT_EQ(Device::cuda(3).str(), "cuda:3");
  EXPECT_EQ(Device::cpu().str(), "cpu");
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:16", "cuda:1x", "CPU", ""})
    EXPECT_ERROR_CONTAINS(Device::parse(bad), "unknown device '" + std::string(bad) + "'");
}

TEST(Device, HostTensorsAreOnTheCpu) {
  Tensor t = Tensor::zeros({3}, DType::F32);
  EXPECT_EQ(t.device(), Device::cpu());
  EXPECT_EQ(t.to(Device::cpu()).device(), Device::cpu());
  EXPECT_EQ(Tensor().device(), Device::cpu());
}

// Without a usable CUDA device a CUDA tensor is an error naming the device, never a crash.
TEST(Device, CudaTensorWithoutADeviceIsAClearError) {
#ifdef MEGATON_WITH_CUDA
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_THROW(Tensor::empty({4}, DType::F32, MemCategory::Other, "x", Device::cuda(0)), Error);
#else
  EXPECT_ERROR_CONTAINS(Tensor::empty({4}, DType::F32, MemCategory::Other, "x", Device::cuda(0)), "cuda:0",
                        "without CUDA");
#endif
}

// CUDA memory goes through the caching pool: a freed tensor's block is reused by the next tensor of
// its size class without new device memory, the per-category live counts still fall back at once,
// and empty_cache hands the idle blocks back. (MEGATON_CUDA_CACHING=0, as under compute-sanitizer,
// turns the pool off: then nothing is cached.)
TEST(Device, CudaMemoryIsCachedForReuse) {
#ifdef MEGATON_WITH_CUDA
  if (cuda::device_count() == 0) GTEST_SKIP() << "skipped: no CUDA device";
  Allocator& a = Allocator::of(Device::cuda(0));
  a.empty_cache();
  const MemStats before = a.stats();
  const size_t bytes = size_t{3} << 20;
  const auto activations = static_cast<size_t>(MemCategory::Activations);
  { Tensor t = Tensor::empty({static_cast<int64_t>(bytes / 4)}, DType::F32, MemCategory::Activations, "t", Device::cuda(0)); }
  const MemStats freed = a.stats();
  EXPECT_EQ(freed.live[activations], before.live[activations]);
  const char* caching = std::getenv("MEGATON_CUDA_CACHING");
  if (caching && std::string(caching) == "0") {
    EXPECT_EQ(freed.cached, 0u);
    return;
  }
  EXPECT_EQ(freed.cached - before.cached, size_t{4} << 20) << "3 MiB in its 4 MiB class, kept";
  {
    Tensor t = Tensor::empty({static_cast<int64_t>(bytes / 4) - 100}, DType::F32, MemCategory::Workspace, "u",
                             Device::cuda(0));
    EXPECT_EQ(a.stats().reserved, freed.reserved) << "the cached block served it";
    EXPECT_EQ(a.stats().cached, before.cached);
  }
  a.empty_cache();
  EXPECT_EQ(a.stats().cached, 0u);
  EXPECT_EQ(a.stats().reserved, before.reserved - before.cached);
#else
  GTEST_SKIP() << "skipped: built without CUDA";
#endif
}
