// The CUDA side of kernels/fp8_gemm.h: one cuBLASLt FP8 GEMM on Hopper (how the operands and scales
// map onto it, and what it refuses: kernels/fp8_gemm_cublas.h). The dispatcher has checked shapes,
// devices and the output dtype.
#pragma once
#include "megaton/kernels/exec_context.h"
#include "megaton/kernels/fp8_quantize.h"

namespace megaton::kernels::cuda {

void fp8_gemm(const ExecContext& ctx, const Tensor& out, const Fp8Matrix& a, const Fp8Matrix& b, bool accumulate,
              const Tensor& bias);

}  // namespace megaton::kernels::cuda
