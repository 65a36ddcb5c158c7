#include "megaton/kernels/cpu/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "megaton/kernels/cpu/element.h"

namespace megaton::kernels::cpu {

namespace {
constexpr int64_t kChunk = 1 << 14;  // fixes the summation order
int64_t num_chunks(int64_t n) { return (n + kChunk - 1) / kChunk; }
}  // namespace

template <typename T>
double sum(const T* x, int64_t n) {
  std::vector<double> partial(static_cast<size_t>(num_chunks(n)));
#pragma omp parallel for schedule(static) if (n >= 4 * kChunk)
  for (int64_t c = 0; c < num_chunks(n); ++c) {
    double s = 0;
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) s += static_cast<double>(x[i]);
    partial[static_cast<size_t>(c)] = s;
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

template <typename T>
float abs_max(const T* x, int64_t n) {
  float m = 0;
  bool nan = false;
  // max is exact and order-free, so the OpenMP reduction gives the same value for any thread
  // count; a NaN is tracked apart because std::max would drop it depending on its position.
#pragma omp parallel for reduction(max : m) reduction(|| : nan) schedule(static) if (n >= 4 * kChunk)
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::fabs(static_cast<float>(load(x[i])));
    nan = nan || std::isnan(v);
    m = std::max(m, v);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

int64_t count_not_equal(const int32_t* ids, int64_t n, int32_t value) {
  int64_t count = 0;
#pragma omp parallel for reduction(+ : count) schedule(static) if (n >= 4 * kChunk)
  for (int64_t i = 0; i < n; ++i) count += ids[i] != value;
  return count;
}

int64_t first_out_of_range(const int32_t* ids, int64_t n, int64_t limit, const int32_t* ignore) {
  int64_t first = n;
#pragma omp parallel for reduction(min : first) schedule(static) if (n >= 4 * kChunk)
  for (int64_t i = 0; i < n; ++i)
    if ((ids[i] < 0 || ids[i] >= limit) && !(ignore && ids[i] == *ignore)) first = std::min(first, i);
  return first == n ? -1 : first;
}

template double sum<float>(const float*, int64_t);
template double sum<double>(const double*, int64_t);
template float abs_max<float>(const float*, int64_t);
template float abs_max<double>(const double*, int64_t);
template float abs_max<BFloat16>(const BFloat16*, int64_t);
template float abs_max<Float16>(const Float16*, int64_t);

}  // namespace megaton::kernels::cpu
