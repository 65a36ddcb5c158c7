// How a batch-1 GEMV walks its weight rows two at a time (gemv_dot.h's dot_pair: each x register
// loaded once for both rows, two weight streams in flight per thread).
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace megaton::kernels::cpu {

// Call inside a parallel region (outside one, the one thread takes every row). This thread's share
// of rows [0, out_f) is one static block. Each band of `band` rows in it (clipped to the share) is
// split into halves walked side by side: pair(r, r + half) for the rows read together, one(r) for a
// band's odd last row. The paired rows are a half-band apart, not neighbours, so that each of the
// two weight streams reads its addresses in order: with neighbouring rows (1.5-3 KiB each at the
// 110M shape) the loads alternated between two spots of one page, and on Zen 4 the hardware
// prefetchers then fell behind. 110M decode there, 2 threads: bf16 95-113 tok/s with neighbours,
// 153-177 one row at a time, 153-177 with half-band pairs; fp32 76-82, 95-105, 99-111
// (docs/performance.md). Every row's dot product has the same bits whichever row shares its call.
template <typename Pair, typename One>
void for_row_pairs(int64_t out_f, int64_t band, Pair&& pair, One&& one) {
  const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
  const int64_t lo = out_f * t / threads, hi = out_f * (t + 1) / threads;
  for (int64_t b0 = lo; b0 < hi;) {
    const int64_t b1 = std::min(hi, (b0 / band + 1) * band), half = (b1 - b0) / 2;
    for (int64_t r = b0; r < b0 + half; ++r) pair(r, r + half);
    if ((b1 - b0) % 2 != 0) one(b1 - 1);
    b0 = b1;
  }
}

// A GEMV's walk over its weight rows inside a parallel region: one x row (decode) takes them in pairs
// (for_row_pairs, bands of `band` rows), a few x rows one weight row at a time, split statically
// over the threads; one(r) handles row r for every x row.
template <typename Pair, typename One>
void walk_rows(int64_t rows, int64_t out_f, int64_t band, Pair&& pair, One&& one) {
  if (rows == 1) return for_row_pairs(out_f, band, pair, one);
#pragma omp for schedule(static)
  for (int64_t r = 0; r < out_f; ++r) one(r);
}

}  // namespace megaton::kernels::cpu
