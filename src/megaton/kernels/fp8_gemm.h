// FP8 GEMM on the CPU, the way Hopper's FP8 tensor cores are used (TN: both operands K-contiguous):
//   out[M, N] (+)= dequant(a)[M, K] dequant(b)[N, K]^T
// with a and b 8-bit (kernels/fp8_quantize.h) and their scales. The products are real FP8 products:
// the codes are widened exactly (every E4M3 / E5M2 value is exact in bf16) into the operand panels of
// a bf16 GEMM with fp32 accumulation (oneDNN where the CPU multiplies bf16 natively; elsewhere the
// same exact values as f32 on OpenBLAS), and the scales are applied in the epilogue:
//   - per-tensor scales: one GEMM over all of K, out = P * scale_inv_a * scale_inv_b;
//   - tiles / blocks along K (DeepSeek-V3's 1x128 activations x 128x128 weights, or 1x128 x 1x128 for
//     the weight gradient): one GEMM per 128-wide group of K whose fp32 partial sum is scaled per
//     (row tile, column block) and added to the result: DeepSeek-V3's promotion of the partial sums
//     to fp32 every 128 along K;
//   - MXFP8 (1x32, power-of-two scales): the scales are folded into the widening, which is exact, so
//     one GEMM over all of K.
// Mixed granularities combine with the group width of the finer one (the coarser scale is looked up
// per group). Formats may differ (E4M3 x E5M2 in HYBRID's backward).
// On a CUDA device the operands (Fp8Matrix::to, or fp8_quantize of a CUDA tensor) go to one
// cuBLASLt FP8 GEMM on Hopper's tensor cores, fp32 accumulation, scales applied per tensor or per
// DeepSeek-V3 block by cuBLASLt; kernels/fp8_gemm_cublas.h says which combinations it takes.
#pragma once
#include <functional>

#include "megaton/kernels/exec_context.h"
#include "megaton/kernels/fp8_quantize.h"

namespace megaton::kernels {

// The rows one GEMM call of an epilogue's stripes computes (handed over kFp8StripeRows at a time).
// Each call streams all of b again, so calls are as tall as keeps their output in the last-level
// cache: 512 rows of a 3072-wide bf16 output are 3 MB (docs/performance.md measures 128 and 512).
constexpr int64_t kFp8GemmStripeRows = 4 * kFp8StripeRows;

// Called with rows [r0, r1) of the output once they are final (bias added, rounded to out's dtype).
using Fp8RowsDone = std::function<void(int64_t r0, int64_t r1)>;

// out: f32 or bf16 [M, N]; accumulate adds to an f32 out instead of overwriting it; bias (f32 or
// out's dtype, [N], optional) is added to every row in fp32 before the result is rounded.
// With rows_done the output is handed over in stripes of kFp8StripeRows rows, in order, each once it
// is final: the epilogue of a fused layer (LayerNormMLP's activation and FP8 cast of fc2's input,
// nn/mlp.h). On oneDNN the GEMM itself runs kFp8GemmStripeRows rows at a time, so a stripe is handed
// over while it is still in cache, with b's panels widened once for all of them (N x K widened values
// of workspace instead of N x 128); on OpenBLAS it runs whole first. The values are the same bit for
// bit.
void fp8_gemm(const ExecContext& ctx, const Tensor& out, const Fp8Matrix& a, const Fp8Matrix& b,
              bool accumulate = false, const Tensor& bias = {}, const Fp8RowsDone& rows_done = {});

}  // namespace megaton::kernels
