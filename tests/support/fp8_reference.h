// FP8 test inputs and the double-precision reference of an FP8 GEMM, shared by the CPU and CUDA FP8
// GEMM tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <random>

#include "megaton/kernels/fp8_quantize.h"

namespace megaton::test {

// Normal values whose magnitude varies smoothly over rows and columns by up to 2^spread, so per-tile
// scales differ from the tensor's (f32, on the host).
inline Tensor fp8_test_matrix(int64_t rows, int64_t cols, uint32_t seed, float spread) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor t = Tensor::empty({rows, cols}, DType::F32, MemCategory::Other, "x");
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      t.data<float>()[r * cols + c] =
          normal(gen) * std::exp2(spread * std::sin(0.37f * static_cast<float>(r) + 0.11f * static_cast<float>(c)));
  return t;
}

// out[m, n] of a b^T as the sum over K groups of (sum_k value_a * value_b) * scale_a * scale_b, in
// double, with the groups a kernel promises (the finer granularity's width along K); a and b on the
// host. `magnitude` (optional) receives sum_k |value_a * scale_a * value_b * scale_b|, which bounds
// the rounding of an fp32 sum.
inline double fp8_reference_at(const kernels::Fp8Matrix& a, const kernels::Fp8Matrix& b, int64_t m, int64_t n,
                               int64_t group, double* magnitude = nullptr) {
  const int64_t K = a.data.size(1);
  const auto* ca = static_cast<const uint8_t*>(a.data.raw());
  const auto* cb = static_cast<const uint8_t*>(b.data.raw());
  double total = 0.0, size = 0.0;
  for (int64_t k0 = 0; k0 < K; k0 += group) {
    double part = 0.0, part_size = 0.0;
    for (int64_t k = k0; k < std::min(K, k0 + group); ++k) {
      const double p = static_cast<double>(fp8::decode(ca[m * K + k], a.format())) * fp8::decode(cb[n * K + k], b.format());
      part += p;
      part_size += std::fabs(p);
    }
    const double s = static_cast<double>(a.scale_inv_at(m, k0)) * b.scale_inv_at(n, k0);
    total += part * s;
    size += part_size * std::fabs(s);
  }
  if (magnitude) *magnitude = size;
  return total;
}

}  // namespace megaton::test
