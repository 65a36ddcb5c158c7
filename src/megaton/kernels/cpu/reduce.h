// Reductions over whole tensors (CPU reference): sums for losses, the largest magnitude, counts and
// range checks of ids.
#pragma once
#include <cstdint>

namespace megaton::kernels::cpu {

// sum of x[0..n) in double, over fixed chunks added in chunk order (same bits for any thread count).
template <typename T>
double sum(const T* x, int64_t n);
// max |x[i]| over [0, n) in fp32; NaN if any x[i] is NaN; 0 when n == 0.
template <typename T>
float abs_max(const T* x, int64_t n);
// Number of ids[i] != value.
int64_t count_not_equal(const int32_t* ids, int64_t n, int32_t value);
// Index of the first id outside [0, limit), or -1 if there is none; with `ignore`, ids equal to
// *ignore are allowed too.
int64_t first_out_of_range(const int32_t* ids, int64_t n, int64_t limit, const int32_t* ignore);

}  // namespace megaton::kernels::cpu
