#include "megaton/kernels/cpu/cross_entropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "finite_diff.h"
#include "megaton/kernels/cpu/fast_exp.h"

using namespace megaton;
using namespace megaton::kernels;
using namespace megaton::kernels::cpu;

namespace {

// The unsplit forward: the three kernels with nothing to reduce between them.
template <typename T>
void cross_entropy_forward(T* loss, T* lse, const T* logits, const int32_t* targets, int64_t N, int64_t V) {
  std::vector<T> row_max(N), sum_exp(N), target_logit(N);
  cross_entropy_row_max(row_max.data(), logits, N, V);
  cross_entropy_sum_exp(sum_exp.data(), target_logit.data(), logits, row_max.data(), targets, 0, N, V);
  cross_entropy_loss(loss, lse, row_max.data(), sum_exp.data(), target_logit.data(), targets, N);
}

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

// Softmax materialised in long double with the row max subtracted, so no term can overflow
// whatever the logits; gradient for grad_scale = 1.
template <typename T>
NaiveCe naive_cross_entropy(const std::vector<T>& logits, const std::vector<int32_t>& targets, int64_t N, int64_t V) {
  NaiveCe r{std::vector<double>(N), std::vector<double>(N), std::vector<double>(N * V, 0.0)};
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == kIgnoreIndex) continue;
    const T* x = &logits[n * V];
    long double mx = -INFINITY, sum = 0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<long double>(x[v]));
    for (int64_t v = 0; v < V; ++v) sum += std::exp(x[v] - mx);
    const long double lse = mx + std::log(sum);
    r.lse[n] = static_cast<double>(lse);
    r.loss[n] = static_cast<double>(lse - x[targets[n]]);
    for (int64_t v = 0; v < V; ++v)
      r.dlogits[n * V + v] = static_cast<double>(std::exp(x[v] - lse) - (v == targets[n]));
  }
  return r;
}

// Forward and backward (grad_scale = 1) against the reference; ignored rows are exactly 0.
template <typename T>
void expect_matches_naive(const std::vector<T>& logits, const std::vector<int32_t>& targets, int64_t N, int64_t V,
                          double tol) {
  std::vector<T> loss(N), lse(N), dlogits(N * V);
  cross_entropy_forward(loss.data(), lse.data(), logits.data(), targets.data(), N, V);
  cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), 0, T(1), N, V);
  const NaiveCe want = naive_cross_entropy(logits, targets, N, V);
  auto as_double = [](const std::vector<T>& v) { return std::vector<double>(v.begin(), v.end()); };
  EXPECT_TRUE(fd::close(as_double(loss), want.loss, tol)) << "loss";
  EXPECT_TRUE(fd::close(as_double(lse), want.lse, tol)) << "lse";
  EXPECT_TRUE(fd::close(as_double(dlogits), want.dlogits, tol)) << "dlogits";
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] != kIgnoreIndex) continue;
    EXPECT_EQ(loss[n], T(0));
    for (int64_t v = 0; v < V; ++v) ASSERT_EQ(dlogits[n * V + v], T(0)) << "ignored row " << n;
  }
}

// Rows of logits near +1000 (e^1000 overflows float and double alike), near -1000 (every e^x
// underflows to 0, so an unshifted sum is 0 and its log -inf) and spread over [-1000, 1000]. Only
// the row max subtraction keeps these finite and exact.
template <typename T>
std::vector<T> overflowing_logits(int64_t N, int64_t V) {
  auto logits = fd::random_vector<T>(N * V, 9, -20.0, 20.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < V; ++v) {
      T& x = logits[n * V + v];
      x = n % 3 == 0 ? x + T(1000) : n % 3 == 1 ? x - T(1000) : x * T(50);
    }
  return logits;
}

}  // namespace

// fast_exp against std::exp at every 1e-3 step over the range softmax uses: relative error near
// float rounding, and the cut-off below the normal range is exactly 0. Checked per point, so that a
// NaN fails too.
TEST(CrossEntropy, FastExpMatchesStdExp) {
  for (float x = -87.0f; x <= 88.0f; x += 1e-3f) {
    const double want = std::exp(double(x));
    ASSERT_LT(std::abs(detail::fast_exp(x) - want) / want, 3e-7) << "x = " << x << ", fast_exp " << detail::fast_exp(x);
  }
  EXPECT_EQ(detail::fast_exp(-88.0f), 0.0f);
  EXPECT_EQ(detail::fast_exp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(detail::fast_exp(0.0f), 1.0f);
  EXPECT_TRUE(std::isnan(detail::fast_exp(std::numeric_limits<float>::quiet_NaN())));
}

// Logits in +-60: each row is dominated by a few entries and the smallest probabilities (down to
// e^-120) fall below float's normal range, where fast_exp cuts off to 0. The result must still be
// within float rounding of the reference.
TEST(CrossEntropy, MatchesNaiveSoftmaxOnWideLogits) {
  const int64_t N = 33, V = 1001;
  expect_matches_naive(fd::random_vector<float>(N * V, 1, -60.0, 60.0), make_targets(N, V, 2), N, V, 5e-6);
}

// In float the kernel's lse near +-1000 is rounded to an ulp of 6e-5, which the loss and
// exp(x - lse) inherit: hence 1e-4 there. A missing max subtraction gives lse = -inf or a
// saturated value ~100, far outside either tolerance.
TEST(CrossEntropy, LogitsThatOverflowExpStayExact) {
  const int64_t N = 12, V = 1001;
  const auto targets = make_targets(N, V, 10);
  expect_matches_naive(overflowing_logits<double>(N, V), targets, N, V, 1e-12);
  expect_matches_naive(overflowing_logits<float>(N, V), targets, N, V, 1e-4);
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
  cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), 0, grad_scale, N, V);
  EXPECT_TRUE(fd::close(dlogits, fd::numeric_gradient(logits, total), 1e-7));
}

TEST(CrossEntropy, InPlaceBackwardMatchesOutOfPlace) {
  const int64_t N = 9, V = 257;
  auto logits = fd::random_vector<float>(N * V, 5, -5.0, 5.0);
  auto targets = make_targets(N, V, 6);
  std::vector<float> loss(N), lse(N), dlogits(N * V);
  cross_entropy_forward(loss.data(), lse.data(), logits.data(), targets.data(), N, V);
  cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), 0, 0.5f, N, V);
  cross_entropy_backward(logits.data(), logits.data(), lse.data(), targets.data(), 0, 0.5f, N, V);
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
      cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), 0, 1.0f, N, V);
    });
    dlogits.insert(dlogits.end(), loss.begin(), loss.end());
    return dlogits;
  };
  EXPECT_TRUE(fd::same_bits(run(1), run(2)));
}

// Vocab-parallel: the vocabulary split into shards of 400, 1 and 600 entries, each shard running
// the kernels on its columns with the reductions done here (MAX of row_max, SUM of sum_exp and
// target_logit), gives the unsplit loss and lse to rounding and each shard's columns of dlogits.
TEST(CrossEntropy, VocabShardsWithTheirReductionsMatchTheUnsplitKernels) {
  const int64_t N = 13, V = 1001;
  const auto logits = fd::random_vector(N * V, 11, -30.0, 30.0);
  const auto targets = make_targets(N, V, 12);
  std::vector<double> loss(N), lse(N), dlogits(N * V);
  cross_entropy_forward(loss.data(), lse.data(), logits.data(), targets.data(), N, V);
  cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), 0, 0.5, N, V);

  const std::vector<std::pair<int64_t, int64_t>> shards = {{0, 400}, {400, 1}, {401, 600}};
  auto columns = [&](const std::vector<double>& m, int64_t start, int64_t width) {
    std::vector<double> out(N * width);
    for (int64_t n = 0; n < N; ++n)
      std::copy_n(&m[n * V + start], width, &out[n * width]);
    return out;
  };
  std::vector<double> row_max(N, -INFINITY), sum_exp(N, 0.0), target_logit(N, 0.0);
  for (auto [start, width] : shards) {
    std::vector<double> part(N);
    cross_entropy_row_max(part.data(), columns(logits, start, width).data(), N, width);
    for (int64_t n = 0; n < N; ++n) row_max[n] = std::max(row_max[n], part[n]);  // all-reduce MAX
  }
  for (auto [start, width] : shards) {
    std::vector<double> se(N), tl(N);
    cross_entropy_sum_exp(se.data(), tl.data(), columns(logits, start, width).data(), row_max.data(), targets.data(),
                          start, N, width);
    for (int64_t n = 0; n < N; ++n) sum_exp[n] += se[n], target_logit[n] += tl[n];  // all-reduce SUM
  }
  std::vector<double> got_loss(N), got_lse(N);
  cross_entropy_loss(got_loss.data(), got_lse.data(), row_max.data(), sum_exp.data(), target_logit.data(),
                     targets.data(), N);
  EXPECT_TRUE(fd::close(got_loss, loss, 1e-12));
  EXPECT_TRUE(fd::close(got_lse, lse, 1e-12));
  for (auto [start, width] : shards) {
    std::vector<double> d(N * width);
    cross_entropy_backward(d.data(), columns(logits, start, width).data(), got_lse.data(), targets.data(), start, 0.5,
                           N, width);
    EXPECT_TRUE(fd::close(d, columns(dlogits, start, width), 1e-12)) << "shard at " << start;
  }
}
