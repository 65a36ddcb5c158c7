#include "megaton/kernels/cuda/fp8_scale_layout.h"

#include "megaton/core/cuda/cuda_check.h"

namespace megaton::kernels::cuda {

namespace {

__global__ void relayout_kernel(float* out, const float* src, int64_t src_rows, int64_t src_cols, int64_t outer,
                                int64_t inner, bool transposed) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= outer * inner) return;
  const int64_t o = i / inner, n = i % inner;
  const int64_t r = transposed ? n : o, c = transposed ? o : n;
  out[i] = r < src_rows && c < src_cols ? src[r * src_cols + c] : 1.0f;
}

}  // namespace

void relayout_scales(float* out, const Fp8Matrix& m, const CublasScaleLayout& layout, cudaStream_t stream) {
  const int64_t n = layout.outer * layout.inner;
  if (n == 0) return;
  constexpr int kThreads = 256;
  relayout_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      out, static_cast<const float*>(m.scale_inv.raw()), m.scale_inv.size(0), m.scale_inv.size(1), layout.outer,
      layout.inner, layout.transposed);
  MEGATON_CUDA_CHECK(cudaGetLastError());
}

}  // namespace megaton::kernels::cuda
