// The machine's measured single-precision GEMM ceiling: the reference for "achieved GFLOP/s"
// and, when no peak is configured, for MFU. Measured, never assumed: shared machines vary.
#pragma once

namespace megaton::kernels {

// Best GFLOP/s of `repeats` square n x n x n sgemm calls with the current thread setting. The best,
// not the median: a ceiling is what the machine can do, and on a shared machine the slower
// repeats measure the neighbours (medians of 5 were seen 20% below the per-shape GEMM rates).
double measure_sgemm_gflops(int n = 1536, int repeats = 10);

}  // namespace megaton::kernels
