// Helpers for the embedding/norm/activation/rope kernel tests: reproducible random inputs,
// central-difference gradients and running code under a given OpenMP thread count.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

namespace megaton::fd {

// Uniform values in [lo, hi) from a fixed seed.
template <typename T = double>
std::vector<T> random_vector(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(dist(gen));
  return v;
}

// sum(a * b): the scalar loss sum(dout * out), whose gradient w.r.t. out is dout.
inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// d loss / d p by central differences. Each entry of p is perturbed in place and restored, so
// loss() must read p. h = 1e-5 balances truncation (h^2) against round-off (eps / h) in double.
inline std::vector<double> numeric_gradient(std::vector<double>& p, const std::function<double()>& loss,
                                            double h = 1e-5) {
  std::vector<double> grad(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    const double saved = p[i];
    p[i] = saved + h;
    const double up = loss();
    p[i] = saved - h;
    const double down = loss();
    p[i] = saved;
    grad[i] = (up - down) / (2.0 * h);
  }
  return grad;
}

// max |analytic - numeric| / max |numeric|: relative to the gradient's scale, so entries that
// are (nearly) zero cannot blow the ratio up.
inline double relative_error(const std::vector<double>& analytic, const std::vector<double>& numeric) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < analytic.size(); ++i) {
    diff = std::max(diff, std::abs(analytic[i] - numeric[i]));
    scale = std::max(scale, std::abs(numeric[i]));
  }
  return diff / scale;
}

// Bitwise equality (== would treat -0 and +0 as equal).
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Runs f() with n OpenMP threads, then restores the previous setting.
template <typename F>
void with_threads(int n, F&& f) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(n);
  f();
  omp_set_num_threads(saved);
}

}  // namespace megaton::fd
