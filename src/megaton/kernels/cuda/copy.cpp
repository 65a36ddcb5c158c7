#include "megaton/kernels/cuda/copy.h"

#include <cuda_runtime.h>

#include "megaton/core/cuda/cuda_check.h"

namespace megaton::kernels::cuda {

void copy_rows(const ExecContext& ctx, const Tensor& dst, int64_t dst_row, int64_t dst_col, const Tensor& src,
               int64_t src_row, int64_t src_col, int64_t rows, int64_t cols) {
  expect_dtype(src.dtype(), "copy_rows", {&dst});
  const int64_t B = src.size(0);
  if (B == 0 || rows == 0 || cols == 0) return;
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  const auto elt = static_cast<int64_t>(dtype_size(src.dtype()));
  const int64_t dst_R = dst.size(1), dst_C = dst.size(2), src_R = src.size(1), src_C = src.size(2);
  auto* d = static_cast<char*>(dst.raw());
  const auto* s = static_cast<const char*>(src.raw());
  for (int64_t b = 0; b < B; ++b) {
    MEGATON_CUDA_CHECK(
        cudaMemcpy2DAsync(d + ((b * dst_R + dst_row) * dst_C + dst_col) * elt, static_cast<size_t>(dst_C * elt),
                          s + ((b * src_R + src_row) * src_C + src_col) * elt, static_cast<size_t>(src_C * elt),
                          static_cast<size_t>(cols * elt), static_cast<size_t>(rows), cudaMemcpyDeviceToDevice,
                          static_cast<cudaStream_t>(ctx.stream)));
  }
}

}  // namespace megaton::kernels::cuda
