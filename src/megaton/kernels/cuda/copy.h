// CUDA strided block copy between [B, R, C] tensors of the same dtype (any dtype: bytes are
// copied), one cudaMemcpy2DAsync per batch row on ctx's stream. Blocks were checked by
// kernels/copy.cpp; the sizes are passed along.
#pragma once
#include "megaton/kernels/exec_context.h"

namespace megaton::kernels::cuda {

// dst[b, dst_row + r, dst_col + c] = src[b, src_row + r, src_col + c] for b < B, r < rows, c < cols.
void copy_rows(const ExecContext& ctx, const Tensor& dst, int64_t dst_row, int64_t dst_col, const Tensor& src,
               int64_t src_row, int64_t src_col, int64_t rows, int64_t cols);

}  // namespace megaton::kernels::cuda
