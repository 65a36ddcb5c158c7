#pragma once

#include <cstdint>

namespace megaton::kernels::cpu {

// Elements (weights read, or values written) below which a kernel runs on the calling thread
// instead of opening an OpenMP region. Starting and joining a team costs the master a futex wake (a
// system call: 1.1 us on the 2-core EPYC VM, libgomp makes it whether or not a thread sleeps), while
// one core does 32 K fused element operations in about that time. Batch-1 decode calls the norms,
// RoPE, SwiGLU, residual adds and KV-cache copies on one token's rows: as regions they were 86 of 149
// per token of the 110M shape (performance.md, "Per-token overhead: OpenMP regions and futex wakes").
constexpr int64_t kParallelMin = 1 << 15;

// f(i) for i in [0, n): on the calling thread when `work` (elements) is below kParallelMin, else
// split statically over the OpenMP threads. A branch, not an `if` clause: under `if (false)` libgomp
// still opens and closes a team of one, with its futex wake.
template <typename F>
void parallel_for(int64_t n, int64_t work, F&& f) {
  if (work < kParallelMin) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) f(i);
}

}  // namespace megaton::kernels::cpu
