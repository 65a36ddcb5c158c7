// `megaton bench --gemm-shapes`: the GEMM rate of every linear shape a training step of a preset
// runs (forward, input-gradient and weight-gradient GEMM of each layer kind), timed in isolation
// with the model's own linear kernels, next to the square sgemm ceiling of the same run. Tells
// whether a gap to the ceiling is in the GEMMs or in the elementwise work between them.
#pragma once
#include <cstdint>
#include <string>

#include "megaton/core/device.h"
#include "megaton/core/dtype.h"
#include "megaton/models/transformer_config.h"

namespace megaton::app {

// The machine's measured matrix rate in `dtype` (GFLOP/s): on the cpu in f32 the sgemm ceiling, else
// the best of ten square GEMMs through the model's own linear kernel (1536^3 on the cpu, 8192^3 on CUDA).
double gemm_ceiling_gflops(Device device, DType dtype);

// Prints one line per (linear, pass) or, with json, one JSON object per line. f32 or bf16 against
// the measured square GEMM rate of the same dtype (on the cpu in f32: the sgemm rate).
void print_gemm_shapes(const models::TransformerConfig& cfg, int64_t tokens, int repeats, bool json, Device device,
                       DType dtype);

// The same shapes as FP8 GEMMs (kernels/fp8_gemm.h) next to bf16 GEMMs of the same run: per-tensor
// scales with E5M2 gradients (fp8-tensorwise, HYBRID), or DeepSeek-V3's 1x128 activation and
// gradient tiles with 128x128 weight blocks, E4M3 (blockwise). The timed call is the GEMM alone on
// operands quantised beforehand (the quantisation time is reported beside it); a shape the device's
// FP8 GEMM does not take is listed as skipped, with the reason.
void print_fp8_gemm_shapes(const models::TransformerConfig& cfg, int64_t tokens, int repeats, bool json, Device device,
                           bool blockwise);

}  // namespace megaton::app
