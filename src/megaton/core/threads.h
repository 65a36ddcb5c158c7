// One knob for the CPU thread count: OpenMP regions and OpenBLAS GEMMs use the same number. Kernels
// call BLAS from inside an OpenMP region only to run several single-threaded GEMMs side by side
// (the MoE grouped GEMM): OpenBLAS's OpenMP build and oneDNN run a call on one thread inside an
// active region, so nothing is oversubscribed.
#pragma once

namespace megaton {
void set_num_threads(int n);  // n <= 0: keep OMP_NUM_THREADS / the hardware default
int num_threads();

// Frees the calling thread's idle OpenMP workers (omp_pause_resource_all). libgomp counts the
// workers of every thread's team against the cores, and once they outnumber the cores it lets every
// team's workers sleep between parallel regions instead of spinning, so each region starts with a
// futex wake-up. A thread that hands its OpenMP work to another thread for good (serve loads the
// model, then decodes on its queue's thread) calls this first: measured on 2 cores, a region after a
// short serial gap cost ~70 us with the idle team alive and ~11 us without, and a decode token runs
// ~60 regions. A soft pause: libgomp frees the threads for either kind, while a hard pause shut
// LLVM's libomp down (the sanitizer build's runtime: its next region on this thread crashed).
void release_idle_threads();
}  // namespace megaton
