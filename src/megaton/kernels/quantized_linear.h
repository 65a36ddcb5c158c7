// Linear layers over 8-bit weights for inference (issue 15's weight dtypes): the weight is stored as
// codes plus fp32 block scales and only ever dequantised inside the kernels:
//   int8       int8 codes, one symmetric scale per output row (scale_inv = amax(row) / 127);
//   fp8-block  E4M3 codes, one scale per 128 x 128 block: DeepSeek-V3's released weights
//              (`weight_scale_inv` beside each FP8 weight), quantised as kernels/fp8_quantize.h's
//              Block128x128 (round to nearest even, scale = 448 / amax(block)).
// Batch-1 decode runs the streaming GEMV of cpu/gemv_quantized.h (a quarter of fp32's weight bytes
// per token); several rows (prefill) dequantise the weight one band of rows at a time into a
// workspace and multiply with the f32 GEMM, so no full-precision copy of a weight ever exists.
// Forward only: these layers do not train. CPU only.
#pragma once
#include <string>
#include <string_view>

#include "megaton/kernels/exec_context.h"

namespace megaton::kernels {

enum class WeightQuant : uint8_t { Int8Row, Fp8Block };
std::string_view weight_quant_name(WeightQuant q);      // "int8", "fp8-block"
WeightQuant weight_quant_from_name(std::string_view s);  // throws naming the choices

struct QuantizedWeight {
  WeightQuant kind = WeightQuant::Int8Row;
  Tensor codes;      // I8 or F8E4M3 [out, in]
  Tensor scale_inv;  // F32 [ceil(out / block_rows), ceil(in / block_cols)]
  int64_t block_rows = 1, block_cols = 1;
};

// w: a 2-D f32 or bf16 weight [out, in] with finite values (a non-finite one is an error naming
// the tensor). The codes and scales are MemCategory::Params.
QuantizedWeight quantize_weight(const Tensor& w, WeightQuant q);
// The f32 values the codes stand for (tests, and the bound on the quantisation error).
Tensor dequantize_weight(const QuantizedWeight& w);

// w (one scale row per output row, block_rows 1) with its scales kept once per band of rows, the
// widest of max_band, max_band / 2, ... (> 1) for which every row of each band carries bitwise the
// same scales; w unchanged if none does. A weight assembled row by row from stored blocks
// (hf_format.cpp) has per-row scales, and the fp8-block GEMV scales x once per band and pairs rows
// only within one: per-row bands cost 110M-shape fp8-block decode a third of its speed. The fused
// q / k / v interleaves 64-row heads of 128-row stored blocks: 64-row bands. Every value stays.
QuantizedWeight with_row_bands(QuantizedWeight w, int64_t max_band);

// out[N, out] = x[N, in] dequant(w)^T + bias: x and out f32 or bf16 alike, bias f32 or x's dtype
// (or undefined).
void quantized_linear_forward(const ExecContext& ctx, const Tensor& out, const Tensor& x, const QuantizedWeight& w,
                              const Tensor& bias);

}  // namespace megaton::kernels
