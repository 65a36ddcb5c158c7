// Raw CUDA device memory for the core allocator and tensor copies (built only with CUDA). Every
// CUDA runtime call is checked; a failure throws megaton::Error naming the call, file and line.
#pragma once
#include <cstddef>

#include "megaton/core/device.h"

namespace megaton::cuda {

// cudaMalloc, or nullptr when the device is out of memory (the error cleared); other failures throw.
void* device_try_malloc(int device, size_t bytes);
void device_free(int device, void* p);
// Copies bytes between any two of host and CUDA memory (synchronously on the default stream).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
void zero_bytes(void* p, int device, size_t bytes);
// Waits for all work queued on the device (cudaDeviceSynchronize), surfacing asynchronous errors.
void synchronize(int device);
// CUDA devices visible to this process (0 when the driver reports none or no driver is loaded).
int device_count();

}  // namespace megaton::cuda
