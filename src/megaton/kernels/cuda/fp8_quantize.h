// FP8 quantisation of a CUDA tensor, the CUDA side of kernels/fp8_quantize.h: per-tensor (current
// scaling from the tensor's amax, or a given delayed-scaling scale), 1x128 tiles and 128x128 blocks,
// in the rowwise or the transposed (columnwise) layout, E4M3 or E5M2, optional power-of-two scales.
// Codes, scale_inv and amax equal the CPU quantiser's bit for bit. The amax is brought to the host
// (Fp8Matrix::amax), which waits for the stream.
#pragma once
#include "megaton/kernels/fp8_quantize.h"

namespace megaton::kernels::cuda {

// x: 2-D, f32 or bf16, on a CUDA device; runs on that device's default stream.
Fp8Matrix fp8_quantize(const Tensor& x, const Fp8QuantizeOptions& options, const std::string& name);

}  // namespace megaton::kernels::cuda
