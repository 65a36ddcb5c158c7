// Decode over 8-bit weights: y[n, out] = dequant(W)[out, in] x[n, in] (+ bias) for a few rows n
// (cpu/gemv.h: each weight row streamed once for all of them), with the
// dequantisation inside the GEMV (each code widened in registers as its row streams by, never a
// full-precision copy of W). Weight bytes per token are a quarter of fp32's, so a decode bound by
// memory bandwidth runs up to 4x faster. int8 codes with one scale per row (or per tensor) meet x
// in fixed point, in exact integer dot products (cpu/gemv_fixed_x.h); block-scaled codes and E4M3
// are widened to fp32.
#pragma once
#include <cstdint>

#include "megaton/core/dtype.h"
#include "megaton/kernels/cpu/gemv.h"

namespace megaton::kernels::cpu {

// A weight [out, in] of 8-bit codes (I8 or F8E4M3) with an fp32 scale per block of block_rows x
// block_cols (ragged at the edges): the weight at (r, c) is
//   code(r, c) * scale_inv[(r / block_rows) * scale_cols + c / block_cols],  scale_cols = ceil(in / block_cols).
// int8 per-row symmetric is blocks of 1 x in; DeepSeek-V3's FP8 weights are 128 x 128 blocks.
struct QuantizedRows {
  const void* codes;
  DType dtype;  // I8 or F8E4M3
  const float* scale_inv;
  int64_t block_rows, block_cols;
};

// x and y share T (f32 or bf16); the bias B is f32 or T (or null). Each row is accumulated in fp32
// in a fixed order (or exactly, in integers), so y does not depend on the thread count.
template <typename T, typename B>
void gemv_quantized(T* y, const T* x, const QuantizedRows& w, const B* bias, int64_t rows, int64_t in_f, int64_t out_f,
                    GemvPath path = GemvPath::Best);

// Rows [r0, r1) of the weight's values, written to out [r1 - r0, in_f] in f32: one band at a time
// for the prefill GEMM, which needs the values themselves.
void dequantize_rows(float* out, const QuantizedRows& w, int64_t in_f, int64_t r0, int64_t r1);

}  // namespace megaton::kernels::cpu
