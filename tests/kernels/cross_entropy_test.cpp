#include "megaton/kernels/cross_entropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "finite_diff.h"
#include "megaton/kernels/cpu/fast_exp.h"

using namespace megaton;
using namespace megaton::kernels;

namespace {

// Targets in [0, V) with every fifth row ignored.
std::vector<int32_t> make_targets(int64_t N, int64_t V, uint64_t seed) {
  auto u = fd::random_vector(N, seed, 0.0, 1.0);
  std::vector<int32_t> targets(N);
  for (int64_t n = 0; n < N; ++n) targets[n] = n % 5 == 2 ? kIgnoreIndex : static_cast<int32_t>(u[n] * V);
  return targets;
}

struct NaiveCe {
  std::vector<double> loss, lse, dlogits;
};

// Softmax materialised in double, gradient for grad_scale = 1.
NaiveCe naive_cross_entropy(const std::vector<float>& logits, const std::vector<int32_t>& targets, int64_t N,
                            int64_t V) {
  NaiveCe r{std::vector<double>(N), std::vector<double>(N), std::vector<double>(N * V, 0.0)};
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == kIgnoreIndex) continue;
    const float* x = &logits[n * V];
    double mx = -INFINITY, sum = 0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(x[v]));
    for (int64_t v = 0; v < V; ++v) sum += std::exp(x[v] - mx);
    r.lse[n] = mx + std::log(sum);
    r.loss[n] = r.lse[n] - x[targets[n]];
    for (int64_t v = 0; v < V; ++v) r.dlogits[n * V + v] = std::exp(x[v] - r.lse[n]) - (v == targets[n]);
  }
  return r;
}

}  // namespace

// Relative error stays near float rounding over the range softmax uses, and the cut-off is exact 0.
TEST(CrossEntropy, FastExpMatchesStdExp) {
  double worst = 0;
  for (float x = -87.0f; x <= 88.0f; x += 1e-3f) {
    const double want = std::exp(double(x));
    worst = std::max(worst, std::abs(detail::fast_exp(x) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(detail::fast_exp(-88.0f), 0.0f);
  EXPECT_EQ(detail::fast_exp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(detail::fast_exp(0.0f), 1.0f);
  EXPECT_TRUE(std::isnan(detail::fast_exp(std::numeric_limits<float>::quiet_NaN())));
}

// Logits up to +-60 overflow exp() without the max subtraction.
TEST(CrossEntropy, MatchesNaiveSoftmaxOnLargeLogits) {
  const int64_t N = 33, V = 1001;
  auto logits = fd::random_vector<float>(N * V, 1, -60.0, 60.0);
  auto targets = make_targets(N, V, 2);
  std::vector<float> loss(N), lse(N), dlogits(N * V);
  cross_entropy_forward(loss.data(), lse.data(), logits.data(), targets.data(), N, V);
  cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), 1.0f, N, V);
  const NaiveCe want = naive_cross_entropy(logits, targets, N, V);
  auto as_double = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  EXPECT_LT(fd::relative_error(as_double(loss), want.loss), 5e-6);
  EXPECT_LT(fd::relative_error(as_double(lse), want.lse), 5e-6);
  EXPECT_LT(fd::relative_error(as_double(dlogits), want.dlogits), 5e-6);
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] != kIgnoreIndex) continue;
    EXPECT_EQ(loss[n], 0.0f);
    for (int64_t v = 0; v < V; ++v) ASSERT_EQ(dlogits[n * V + v], 0.0f) << "ignored row " << n;
  }
}

// Loss = grad_scale * sum_n loss[n]; odd sizes and ignored rows included.
TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  const int64_t N = 17, V = 37;
  const double grad_scale = 0.3;
  auto logits = fd::random_vector(N * V, 3, -3.0, 3.0);
  auto targets = make_targets(N, V, 4);
  std::vector<double> loss(N), lse(N), dlogits(N * V);
  auto total = [&] {
    cross_entropy_forward(loss.data(), lse.data(), logits.data(), targets.data(), N, V);
    double s = 0;
    for (double l : loss) s += grad_scale * l;
    return s;
  };
  total();
  cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), grad_scale, N, V);
  EXPECT_LT(fd::relative_error(dlogits, fd::numeric_gradient(logits, total)), 1e-7);
}

TEST(CrossEntropy, InPlaceBackwardMatchesOutOfPlace) {
  const int64_t N = 9, V = 257;
  auto logits = fd::random_vector<float>(N * V, 5, -5.0, 5.0);
  auto targets = make_targets(N, V, 6);
  std::vector<float> loss(N), lse(N), dlogits(N * V);
  cross_entropy_forward(loss.data(), lse.data(), logits.data(), targets.data(), N, V);
  cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), 0.5f, N, V);
  cross_entropy_backward(logits.data(), logits.data(), lse.data(), targets.data(), 0.5f, N, V);
  EXPECT_TRUE(fd::same_bits(logits, dlogits));
}

TEST(CrossEntropy, BitwiseIdenticalForOneAndTwoThreads) {
  const int64_t N = 101, V = 999;
  auto logits = fd::random_vector<float>(N * V, 7, -8.0, 8.0);
  auto targets = make_targets(N, V, 8);
  auto run = [&](int threads) {
    std::vector<float> loss(N), lse(N), dlogits(N * V);
    fd::with_threads(threads, [&] {
      cross_entropy_forward(loss.data(), lse.data(), logits.data(), targets.data(), N, V);
      cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), 1.0f, N, V);
    });
    dlogits.insert(dlogits.end(), loss.begin(), loss.end());
    return dlogits;
  };
  EXPECT_TRUE(fd::same_bits(run(1), run(2)));
}
