// Shared by the .cu kernels: fp32 load/store of f32 and bf16 elements, dispatch of a kernel
// template on the tensors' dtype, a deterministic block sum, the grid-size check and the launch check.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "megaton/core/cuda/cuda_check.h"
#include "megaton/kernels/exec_context.h"

namespace megaton::kernels::cuda::detail {

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

// Calls f(float{}) or f(__nv_bfloat16{}) for the dtype of `like`, after checking that every tensor
// in `same` holds it too; throws naming the op otherwise.
template <typename F>
void dispatch_io(std::string_view op, const Tensor& like, std::initializer_list<const Tensor*> same, F&& f) {
  expect_dtype(like.dtype(), op, same);
  if (like.dtype() == DType::F32) return f(float{});
  if (like.dtype() == DType::BF16) return f(__nv_bfloat16{});
  fail("kernel ", op, " on cuda: tensor '", like.name(), "' holds ", dtype_name(like.dtype()), ", expected f32 or bf16");
}

inline cudaStream_t stream_of(const ExecContext& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

// Sum of v over the block (blockDim.x a power of two, shared holding blockDim.x floats), the same
// tree every time (deterministic); every thread gets the result, and shared may be reused after.
__device__ inline float block_sum(float v, float* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  const float total = shared[0];
  __syncthreads();
  return total;
}

// A 1-D grid of `blocks` blocks, checked against CUDA's limit (2^31 - 1) with the op named.
inline unsigned grid_blocks(int64_t blocks, std::string_view op) {
  if (blocks > int64_t{0x7fffffff})
    fail("kernel ", op, " on cuda: ", blocks, " thread blocks exceed CUDA's grid limit");
  return static_cast<unsigned>(blocks);
}

// Launch errors (bad configuration) surface at once; execution errors at the next synchronising call.
#define MEGATON_CUDA_LAUNCH_CHECK() MEGATON_CUDA_CHECK(cudaGetLastError())

}  // namespace megaton::kernels::cuda::detail
