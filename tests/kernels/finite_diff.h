// Helpers for the kernel tests: reproducible random inputs, central-difference gradients, a
// NaN-proof comparison against a reference and running code under a given OpenMP thread count.
#pragma once
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
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

// The failure for a size mismatch or the first non-finite element of either side, if any: what every
// comparison below checks first.
inline std::optional<::testing::AssertionResult> mismatch_or_non_finite(const std::vector<double>& got,
                                                                        const std::vector<double>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << ", the reference has " << want.size();
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(want[i]))
      return ::testing::AssertionFailure() << "reference[" << i << "] = " << want[i] << " is not finite";
    if (!std::isfinite(got[i]))
      return ::testing::AssertionFailure()
             << "got[" << i << "] = " << got[i] << " is not finite (reference " << want[i] << ")";
  }
  return std::nullopt;
}

// Succeeds when max |got - want| / max |want| < tol: relative to the result's scale, so entries
// that are (nearly) zero cannot blow the ratio up. Every element is checked for finiteness first,
// because a max-fold drops NaN (std::max(x, NaN) is x): a kernel that leaves its output NaN, or
// never writes it, must fail here. A size mismatch or an all-zero reference fails too. The message
// names the offending index (the first non-finite one, else the largest error) and both values.
//   EXPECT_TRUE(fd::close(analytic, numeric, 1e-8));
inline ::testing::AssertionResult close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  if (auto failure = mismatch_or_non_finite(got, want)) return *failure;
  double scale = 0.0;
  for (size_t i = 0; i < want.size(); ++i) scale = std::max(scale, std::abs(want[i]));
  if (scale == 0.0) return ::testing::AssertionFailure() << "the reference is all zero: no scale to compare at";
  size_t worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::abs(got[i] - want[i]) > std::abs(got[worst] - want[worst])) worst = i;
  const double err = std::abs(got[worst] - want[worst]) / scale;
  if (err < tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "relative error " << err << " >= " << tol << " at [" << worst << "]: got "
                                       << got[worst] << ", reference " << want[worst] << " (scale " << scale << ", "
                                       << want.size() << " elements)";
}

// Succeeds when every |got - want| <= atol + rtol |want| (elementwise, as torch.testing and
// TransformerEngine's tests compare: bf16 rtol 1.6e-2, atol 1e-5). A NaN or Inf in either fails, as
// does a size mismatch; the message names the worst element relative to its bound.
inline ::testing::AssertionResult close_elementwise(const std::vector<double>& got, const std::vector<double>& want,
                                                    double rtol, double atol) {
  if (auto failure = mismatch_or_non_finite(got, want)) return *failure;
  size_t worst = 0;
  double worst_ratio = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double ratio = std::abs(got[i] - want[i]) / (atol + rtol * std::abs(want[i]));
    if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
  }
  if (worst_ratio <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "|got - reference| exceeds " << atol << " + " << rtol << " |reference| at ["
                                       << worst << "]: got " << got[worst] << ", reference " << want[worst] << " ("
                                       << want.size() << " elements)";
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
