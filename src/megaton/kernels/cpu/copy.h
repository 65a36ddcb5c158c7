// Strided block copy between [B, R, C] row layouts (CPU reference).
#pragma once
#include <cstdint>

namespace megaton::kernels::cpu {

// For b < B, r < rows: dst[b, dst_row + r, dst_col : dst_col + cols] = src[b, src_row + r, src_col : ...],
// with dst [B, dst_R, dst_C] and src [B, src_R, src_C] row-major.
template <typename T>
void copy_rows(T* dst, int64_t dst_R, int64_t dst_C, int64_t dst_row, int64_t dst_col, const T* src, int64_t src_R,
               int64_t src_C, int64_t src_row, int64_t src_col, int64_t B, int64_t rows, int64_t cols);

// For b < B, r < copies: dst[b, dst_row + r, dst_col : dst_col + cols] = src[b, src_row, src_col : ...].
template <typename T>
void broadcast_rows(T* dst, int64_t dst_R, int64_t dst_C, int64_t dst_row, int64_t dst_col, const T* src,
                    int64_t src_R, int64_t src_C, int64_t src_row, int64_t src_col, int64_t B, int64_t copies,
                    int64_t cols);

// For b < B: dst[b, dst_row, dst_col + c] = sum over r < copies of src[b, src_row + r, src_col + c], in order of r,
// accumulated in compute_t<T>.
template <typename T>
void sum_rows(T* dst, int64_t dst_R, int64_t dst_C, int64_t dst_row, int64_t dst_col, const T* src, int64_t src_R,
              int64_t src_C, int64_t src_row, int64_t src_col, int64_t B, int64_t copies, int64_t cols);

// For r < rows, c in [from, cols): t[r, c] = value, with t [rows, cols] row-major.
template <typename T>
void fill_columns(T* t, int64_t rows, int64_t cols, int64_t from, T value);

}  // namespace megaton::kernels::cpu
