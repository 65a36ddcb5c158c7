// MEGATON_HOST_DEVICE marks the small inline functions that CUDA kernels call as well as the CPU
// code (FP8 encoding, scale from amax), so both backends run the very same arithmetic and agree bit
// for bit by construction; float_bits / float_from_bits are the bit casts usable on either side.
#pragma once
#include <bit>
#include <cstdint>

#ifdef __CUDACC__
#define MEGATON_HOST_DEVICE __host__ __device__
#else
#define MEGATON_HOST_DEVICE
#endif

namespace megaton {

MEGATON_HOST_DEVICE inline uint32_t float_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  return std::bit_cast<uint32_t>(x);
#endif
}

MEGATON_HOST_DEVICE inline float float_from_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}

}  // namespace megaton
