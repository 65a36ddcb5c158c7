// How kernels/fp8_gemm.h maps onto cuBLASLt on Hopper (sm_90): the host-side decisions of the CUDA
// FP8 GEMM, kept out of kernels/cuda/ so they compile and are unit-tested on machines without a GPU.
//
// Hopper's FP8 tensor cores take the TN layout only, which is the Fp8Matrix layout: out[M, N] =
// a[M, K] b[N, K]^T with both operands K-contiguous. In cuBLASLt's column-major terms that is
// D[N, M] = op(A = b)^T op(B = a), so b is cuBLASLt's A and a its B. Scales:
//   - per tensor x per tensor: each operand's scale_inv pointer as it is (SCALAR_32F);
//   - DeepSeek-V3's blocks (cuBLAS 12.9+): 1x128 tiles (VEC128_32F) with 128x128 blocks
//     (BLK128x128_32F) in either order, or 1x128 x 1x128 (the weight gradient); 128x128 x 128x128
//     has no cuBLASLt mode. cuBLASLt wants a tile operand's scales with the rows contiguous
//     ([K groups, rows], the rows padded to 4) and a block operand's as [row blocks, K blocks padded
//     to 4]: `cublas_scale_layout` says which, and the CUDA GEMM re-lays Fp8Matrix::scale_inv so.
// Accumulation is fp32 without TF32-style fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM = 0):
// the same promotion the CPU path does. A bias is bf16 (the only bias type cuBLASLt's FP8 epilogue
// takes) and per-tensor scaling only.
#pragma once
#include <string>

#include "megaton/kernels/fp8_quantize.h"

namespace megaton::kernels {

// Why cuBLASLt on sm_90 cannot compute out (dtype `out`, f32 or bf16) = a b^T with these operands
// and this bias (undefined for none); empty when it can.
std::string cublas_fp8_unsupported(const Fp8Matrix& a, const Fp8Matrix& b, DType out, const Tensor& bias);

// The scale tensor cuBLASLt reads for one operand, stored row-major [outer, inner]. With
// `transposed`, element (o, i) is scale_inv[i, o] (1x128 tiles: the K groups outermost); otherwise
// scale_inv[o, i]. Elements past scale_inv's extent are padding (cuBLASLt does not read them).
// Per-tensor scaling is [1, 1] and needs no copy.
struct CublasScaleLayout {
  int64_t outer = 1, inner = 1;
  bool transposed = false;
};
CublasScaleLayout cublas_scale_layout(const Fp8Matrix& m);

}  // namespace megaton::kernels
