#include "megaton/core/cuda/cuda_memory.h"

#include <cuda_runtime.h>

#include "megaton/core/cuda/cuda_check.h"
#include "megaton/core/error.h"

namespace megaton::cuda {

void* device_try_malloc(int device, size_t bytes) {
  if (bytes == 0) return nullptr;
  MEGATON_CUDA_CHECK(cudaSetDevice(device));
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return nullptr;
  }
  MEGATON_CUDA_CHECK(err);
  return p;
}

void device_free(int device, void* p) {
  if (!p) return;
  // Called from destructors: never throw; a failed free is dropped and its sticky error cleared.
  if (cudaSetDevice(device) != cudaSuccess || cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cuda()) MEGATON_CUDA_CHECK(cudaSetDevice(dst_device.index));
  else if (src_device.is_cuda()) MEGATON_CUDA_CHECK(cudaSetDevice(src_device.index));
  MEGATON_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

void zero_bytes(void* p, int device, size_t bytes) {
  if (bytes == 0) return;
  MEGATON_CUDA_CHECK(cudaSetDevice(device));
  MEGATON_CUDA_CHECK(cudaMemset(p, 0, bytes));
}

void synchronize(int device) {
  MEGATON_CUDA_CHECK(cudaSetDevice(device));
  MEGATON_CUDA_CHECK(cudaDeviceSynchronize());
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: clear the sticky error, report none
    return 0;
  }
  return n;
}

}  // namespace megaton::cuda
