// Splitting the columns of a row-major [N, C] matrix over threads, for column reductions that must
// not depend on the thread count: each thread sums its own columns over every row, in row order.
#pragma once
#include <algorithm>
#include <cstdint>
#include <utility>

namespace megaton::kernels::cpu {

// Thread tid's columns [c0, c1) of C split over nt threads; slices start on 16-element (64-byte for
// float) boundaries. Empty (c0 == c1) for threads left without columns.
inline std::pair<int64_t, int64_t> column_slice(int64_t C, int64_t nt, int64_t tid) {
  constexpr int64_t kAlign = 16;
  const int64_t per = (C + nt * kAlign - 1) / (nt * kAlign) * kAlign;
  const int64_t c0 = std::min(C, tid * per);
  return {c0, std::min(C, c0 + per)};
}

}  // namespace megaton::kernels::cpu
