// One knob for the CPU thread count: OpenMP regions and OpenBLAS GEMMs use the same number,
// and kernels never call BLAS from inside an OpenMP region (no oversubscription).
#pragma once

namespace megaton {
void set_num_threads(int n);  // n <= 0: keep OMP_NUM_THREADS / the hardware default
int num_threads();
}  // namespace megaton
