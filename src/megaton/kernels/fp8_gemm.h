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
#include "megaton/kernels/exec_context.h"
#include "megaton/kernels/fp8_quantize.h"

namespace megaton::kernels {

// out: f32 or bf16 [M, N]; accumulate adds to an f32 out instead of overwriting it; bias (f32 or
// out's dtype, [N], optional) is added to every row in fp32 before the result is rounded.
void fp8_gemm(const ExecContext& ctx, const Tensor& out, const Fp8Matrix& a, const Fp8Matrix& b, bool accumulate = false,
              const Tensor& bias = {});

}  // namespace megaton::kernels
