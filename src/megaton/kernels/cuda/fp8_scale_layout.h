// Copies an Fp8Matrix's scale_inv into the layout cuBLASLt reads (kernels/fp8_gemm_cublas.h).
#pragma once
#include <cuda_runtime.h>

#include "megaton/kernels/fp8_gemm_cublas.h"

namespace megaton::kernels::cuda {

// out: device floats, layout.outer * layout.inner of them; padding is written as 1.
void relayout_scales(float* out, const Fp8Matrix& m, const CublasScaleLayout& layout, cudaStream_t stream);

}  // namespace megaton::kernels::cuda
