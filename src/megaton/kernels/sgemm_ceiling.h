// The machine's measured single-precision GEMM ceiling: the reference for "achieved GFLOP/s"
// and, when no peak is configured, for MFU. Measured, never assumed: shared machines vary.
#pragma once

namespace megaton::kernels {

// Median GFLOP/s of `repeats` square n x n x n sgemm calls with the current thread setting.
double measure_sgemm_gflops(int n = 1536, int repeats = 5);

}  // namespace megaton::kernels
