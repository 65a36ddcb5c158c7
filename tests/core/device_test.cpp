// Devices: parsing, and tensors on a CUDA device failing cleanly where there is none.
#include "megaton/core/device.h"

#include <gtest/gtest.h>

#include "../support/temp_dir.h"
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
