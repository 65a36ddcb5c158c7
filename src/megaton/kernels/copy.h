// Strided block copies on tensors: a rectangle of rows x cols per batch row from one [B, R, C]
// layout into another. What the KV cache append (k / v columns of the fused QKV rows into the
// cache at its current length) and the last-position gather of generation are made of.
// Dispatches to kernels::cpu (f32, f64, bf16, fp16) or kernels::cuda (any dtype, dst and src the same).
#pragma once
#include "megaton/kernels/exec_context.h"

namespace megaton::kernels {

// A corner of a [B, R, C] tensor: the row and column where a block starts in every batch row.
struct BlockAt {
  const Tensor& t;  // 3-D [B, R, C]
  int64_t row = 0, col = 0;
};

// dst[b, dst.row + r, dst.col + c] = src[b, src.row + r, src.col + c] for r < rows, c < cols.
// Throws naming the op and tensor when a block does not fit or B / dtypes differ.
void copy_rows(const ExecContext& ctx, BlockAt dst, BlockAt src, int64_t rows, int64_t cols);

// A row block shared by several rows and its backward: multi-latent attention's one rotary key,
// which every query head's key carries. broadcast_rows writes
// dst[b, dst.row + r, dst.col + c] = src[b, src.row, src.col + c] for r < copies, c < cols;
// sum_rows writes the gradient the other way, dst[b, dst.row, dst.col + c] = the sum over r < copies
// of src[b, src.row + r, src.col + c], accumulated in order of r in f32 (f64 for f64 tensors), so the
// result does not depend on the thread count. f32, f64, bf16, fp16 on the cpu.
void broadcast_rows(const ExecContext& ctx, BlockAt dst, BlockAt src, int64_t copies, int64_t cols);
void sum_rows(const ExecContext& ctx, BlockAt dst, BlockAt src, int64_t copies, int64_t cols);

// t[r, c] = value for every row r and every column c >= from of a 2-D t (f32, f64, bf16 or fp16 on
// the cpu; value rounded to t's dtype): the -inf in a padded vocabulary's columns of the logits.
void fill_columns(const ExecContext& ctx, const Tensor& t, int64_t from, double value);

// FP8 KV pages (cpu/kv_fp8.h): `rows` rows of D = codes.size(2) f32 values from src's block, each
// encoded as E4M3 with its own scale: codes F8E4M3 [1, R, D] and scales F32 [1, R, 1] from row
// `row`. decode_fp8_rows writes the values back into dst's block (f32). CPU only.
void encode_fp8_rows(const ExecContext& ctx, const Tensor& codes, const Tensor& scales, int64_t row, BlockAt src,
                     int64_t rows);
void decode_fp8_rows(const ExecContext& ctx, BlockAt dst, const Tensor& codes, const Tensor& scales, int64_t row,
                     int64_t rows);

}  // namespace megaton::kernels
