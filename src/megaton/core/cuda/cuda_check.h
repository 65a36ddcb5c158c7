// MEGATON_CUDA_CHECK(call): throws megaton::Error naming the failed CUDA runtime call, its error
// string and where it was made.
#pragma once
#include <cuda_runtime.h>

#include "megaton/core/error.h"

#define MEGATON_CUDA_CHECK(call)                                                                     \
  do {                                                                                               \
    const cudaError_t megaton_cuda_err_ = (call);                                                    \
    if (megaton_cuda_err_ != cudaSuccess)                                                            \
      ::megaton::fail(#call, " failed: ", cudaGetErrorString(megaton_cuda_err_), " (", __FILE__, ":", \
                      __LINE__, ")");                                                                \
  } while (0)
