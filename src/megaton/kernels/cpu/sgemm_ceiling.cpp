#include "megaton/kernels/sgemm_ceiling.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace megaton::kernels {

double measure_sgemm_gflops(int n, int repeats) {
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  std::vector<double> rates;
  for (int r = 0; r <= repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) rates.push_back(2.0 * n * n * static_cast<double>(n) / s / 1e9);  // r == 0 warms up
  }
  return *std::max_element(rates.begin(), rates.end());
}

}  // namespace megaton::kernels
