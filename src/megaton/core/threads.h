// One knob for the CPU thread count: OpenMP regions and OpenBLAS GEMMs use the same number. Kernels
// call BLAS from inside an OpenMP region only to run several single-threaded GEMMs side by side
// (the MoE grouped GEMM): OpenBLAS's OpenMP build and oneDNN run a call on one thread inside an
// active region, so nothing is oversubscribed.
#pragma once

namespace megaton {
void set_num_threads(int n);  // n <= 0: keep OMP_NUM_THREADS / the hardware default
int num_threads();
}  // namespace megaton
