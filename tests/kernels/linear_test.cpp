#include "megaton/kernels/cpu/linear.h"

#include <gtest/gtest.h>

#include <vector>

#include "finite_diff.h"

using namespace megaton;
using namespace megaton::kernels::cpu;

namespace {

constexpr int64_t kN = 17, kIn = 24, kOut = 37;

// out = x w^T + bias with plain loops in double.
std::vector<double> naive_linear(const std::vector<float>& x, const std::vector<float>& w,
                                 const std::vector<float>& bias, int64_t N, int64_t in_f, int64_t out_f) {
  std::vector<double> out(N * out_f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out_f; ++o) {
      double s = bias[o];
      for (int64_t i = 0; i < in_f; ++i) s += double(x[n * in_f + i]) * w[o * in_f + i];
      out[n * out_f + o] = s;
    }
  return out;
}

}  // namespace

TEST(Linear, ForwardMatchesNaive) {
  auto x = fd::random_vector<float>(kN * kIn, 1);
  auto w = fd::random_vector<float>(kOut * kIn, 2);
  auto bias = fd::random_vector<float>(kOut, 3);
  std::vector<float> out(kN * kOut), out_nobias(kN * kOut);
  linear_forward(out.data(), x.data(), w.data(), bias.data(), kN, kIn, kOut);
  linear_forward(out_nobias.data(), x.data(), w.data(), static_cast<const float*>(nullptr), kN, kIn, kOut);
  const std::vector<double> got(out.begin(), out.end()), got_nobias(out_nobias.begin(), out_nobias.end());
  EXPECT_TRUE(fd::close(got, naive_linear(x, w, bias, kN, kIn, kOut), 1e-6));
  EXPECT_TRUE(fd::close(got_nobias, naive_linear(x, w, std::vector<float>(kOut, 0.0f), kN, kIn, kOut), 1e-6));
}

// Loss = sum(dout * out). dw and dbias start non-zero to check that they are accumulated.
TEST(Linear, GradientsMatchFiniteDifferencesAndAccumulate) {
  auto x = fd::random_vector(kN * kIn, 4);
  auto w = fd::random_vector(kOut * kIn, 5);
  auto bias = fd::random_vector(kOut, 6);
  auto dout = fd::random_vector(kN * kOut, 7);
  std::vector<double> out(kN * kOut);
  auto loss = [&] {
    linear_forward(out.data(), x.data(), w.data(), bias.data(), kN, kIn, kOut);
    return fd::dot(dout, out);
  };
  std::vector<double> dx(x.size(), 3.0), dw(w.size(), 0.5), dbias(bias.size(), -0.25);
  linear_backward_input(dx.data(), dout.data(), w.data(), kN, kIn, kOut);
  linear_backward_weight(dw.data(), dbias.data(), dout.data(), x.data(), kN, kIn, kOut);
  for (double& g : dw) g -= 0.5;
  for (double& g : dbias) g += 0.25;
  EXPECT_TRUE(fd::close(dx, fd::numeric_gradient(x, loss), 1e-7));
  EXPECT_TRUE(fd::close(dw, fd::numeric_gradient(w, loss), 1e-7));
  EXPECT_TRUE(fd::close(dbias, fd::numeric_gradient(bias, loss), 1e-7));
}

TEST(Linear, NullBiasGradientIsSkipped) {
  auto x = fd::random_vector(kN * kIn, 8);
  auto dout = fd::random_vector(kN * kOut, 9);
  std::vector<double> dw(kOut * kIn, 0.0), dw_with_bias(kOut * kIn, 0.0), dbias(kOut, 0.0);
  linear_backward_weight(dw.data(), static_cast<double*>(nullptr), dout.data(), x.data(), kN, kIn, kOut);
  linear_backward_weight(dw_with_bias.data(), dbias.data(), dout.data(), x.data(), kN, kIn, kOut);
  EXPECT_TRUE(fd::same_bits(dw, dw_with_bias));
}

// The bias gradient reduces over 1000 rows; columns (300, not a multiple of the 16-column slices)
// are split across threads but each column is summed by one thread in row order.
TEST(Linear, BiasGradientIsBitwiseIdenticalForOneAndTwoThreads) {
  const int64_t N = 1000, in_f = 8, out_f = 300;
  auto x = fd::random_vector<float>(N * in_f, 10);
  auto dout = fd::random_vector<float>(N * out_f, 11);
  auto run = [&](int threads) {
    std::vector<float> dw(out_f * in_f, 0.0f), dbias(out_f, 0.0f);
    fd::with_threads(threads,
                     [&] { linear_backward_weight(dw.data(), dbias.data(), dout.data(), x.data(), N, in_f, out_f); });
    return dbias;
  };
  EXPECT_TRUE(fd::same_bits(run(1), run(2)));
}
