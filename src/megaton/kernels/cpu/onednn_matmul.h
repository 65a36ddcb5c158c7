// cpu::gemm through oneDNN's matmul primitive (bf16 and f32 operands, fp32 accumulation). oneDNN picks
// its kernel for the CPU it runs on (AMX, AVX-512 BF16, ...).
#pragma once
#include "megaton/kernels/cpu/gemm.h"

namespace megaton::kernels::cpu {

// Whether oneDNN has a matmul for `in` operands and a `c` result on this CPU (bf16 needs AVX-512).
bool onednn_has_matmul(DType in, DType c);
// Throws naming the dtypes and the CPU when oneDNN has no such matmul here.
void onednn_matmul(const Gemm& g);

}  // namespace megaton::kernels::cpu
