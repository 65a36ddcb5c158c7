#include "megaton/kernels/cpu/norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "finite_diff.h"

using namespace megaton;
using namespace megaton::kernels::cpu;

namespace {

constexpr int64_t kN = 17, kC = 37;
constexpr double kEps = 1e-5;

// LayerNorm by definition, in double: biased variance over the row.
std::vector<double> layernorm_reference(const std::vector<float>& x, const std::vector<float>& w,
                                        const std::vector<float>& b, int64_t N, int64_t C) {
  std::vector<double> out(x.size());
  for (int64_t n = 0; n < N; ++n) {
    double mean = 0.0, var = 0.0;
    for (int64_t c = 0; c < C; ++c) mean += x[n * C + c] / static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) var += std::pow(x[n * C + c] - mean, 2) / static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = (x[n * C + c] - mean) / std::sqrt(var + kEps) * w[c] + b[c];
  }
  return out;
}

std::vector<double> rmsnorm_reference(const std::vector<float>& x, const std::vector<float>& w, int64_t N, int64_t C) {
  std::vector<double> out(x.size());
  for (int64_t n = 0; n < N; ++n) {
    double ms = 0.0;
    for (int64_t c = 0; c < C; ++c) ms += std::pow(x[n * C + c], 2) / static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = x[n * C + c] / std::sqrt(ms + kEps) * w[c];
  }
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol * (1.0 + std::abs(want[i]))) << i;
}

}  // namespace

TEST(LayerNorm, ForwardMatchesDefinition) {
  auto x = fd::random_vector<float>(kN * kC, 1, -2.0, 3.0);
  auto w = fd::random_vector<float>(kC, 2);
  auto b = fd::random_vector<float>(kC, 3);
  std::vector<float> out(x.size()), mean(kN), rstd(kN);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), kN, kC, kEps);
  expect_close(out, layernorm_reference(x, w, b, kN, kC), 1e-6);

  // Without bias the output is the same minus b.
  std::vector<float> out_nobias(x.size()), zero(kC, 0.0f);
  layernorm_forward(out_nobias.data(), mean.data(), rstd.data(), x.data(), w.data(), static_cast<const float*>(nullptr),
                    kN, kC, kEps);
  expect_close(out_nobias, layernorm_reference(x, w, zero, kN, kC), 1e-6);
}

// A large common offset (|mean| >> std) is where a one-pass E[x^2] - E[x]^2 in float collapses
// (here it would lose every digit of the variance). The output can only be as good as the float
// mean, which like x itself is known to half an ulp of 1e4 (~5e-4), i.e. ~1e-3 after scaling by
// rstd ~ 1.7.
TEST(LayerNorm, StatisticsStayAccurateWithLargeOffset) {
  const int64_t C = 1024;
  auto x = fd::random_vector<float>(C, 4, 1e4 - 1.0, 1e4 + 1.0);
  std::vector<float> w(C, 1.0f), b(C, 0.0f), out(C), mean(1), rstd(1);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), 1, C, kEps);
  const std::vector<double> want = layernorm_reference(x, w, b, 1, C);
  for (int64_t c = 0; c < C; ++c) EXPECT_NEAR(out[c], want[c], 1e-3);
  double m = 0.0, var = 0.0;
  for (float v : x) m += v / static_cast<double>(C);
  for (float v : x) var += (v - m) * (v - m) / static_cast<double>(C);
  EXPECT_NEAR(rstd[0], 1.0 / std::sqrt(var + kEps), 1e-6 / std::sqrt(var));
}

// Loss = sum(dout * out) over x, weight and bias. dx is written over garbage; the weight gradients
// start non-zero to check they accumulate.
TEST(LayerNorm, GradientsMatchFiniteDifferences) {
  auto x = fd::random_vector(kN * kC, 5, -2.0, 3.0);
  auto w = fd::random_vector(kC, 6);
  auto b = fd::random_vector(kC, 7);
  auto dout = fd::random_vector(kN * kC, 8);
  std::vector<double> out(x.size()), mean(kN), rstd(kN);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), kN, kC, kEps);
    return fd::dot(dout, out);
  };
  loss();
  std::vector<double> dx(x.size(), 123.0), dw(kC, 1.0), db(kC, 1.0);
  layernorm_backward_input(dx.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(), kN, kC);
  layernorm_backward_weight(dw.data(), db.data(), dout.data(), x.data(), mean.data(), rstd.data(), kN, kC);
  for (double& g : dw) g -= 1.0;
  for (double& g : db) g -= 1.0;
  EXPECT_TRUE(fd::close(dx, fd::numeric_gradient(x, loss), 1e-8));
  EXPECT_TRUE(fd::close(dw, fd::numeric_gradient(w, loss), 1e-8));
  EXPECT_TRUE(fd::close(db, fd::numeric_gradient(b, loss), 1e-8));
}

TEST(RmsNorm, ForwardMatchesDefinition) {
  auto x = fd::random_vector<float>(kN * kC, 9, -2.0, 3.0);
  auto w = fd::random_vector<float>(kC, 10);
  std::vector<float> out(x.size()), rstd(kN);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), kN, kC, kEps);
  expect_close(out, rmsnorm_reference(x, w, kN, kC), 1e-6);
}

TEST(RmsNorm, GradientsMatchFiniteDifferences) {
  auto x = fd::random_vector(kN * kC, 11, -2.0, 3.0);
  auto w = fd::random_vector(kC, 12);
  auto dout = fd::random_vector(kN * kC, 13);
  std::vector<double> out(x.size()), rstd(kN);
  auto loss = [&] {
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), kN, kC, kEps);
    return fd::dot(dout, out);
  };
  loss();
  std::vector<double> dx(x.size(), 123.0), dw(kC, 1.0);
  rmsnorm_backward_input(dx.data(), dout.data(), x.data(), w.data(), rstd.data(), kN, kC);
  rmsnorm_backward_weight(dw.data(), dout.data(), x.data(), rstd.data(), kN, kC);
  for (double& g : dw) g -= 1.0;
  EXPECT_TRUE(fd::close(dx, fd::numeric_gradient(x, loss), 1e-8));
  EXPECT_TRUE(fd::close(dw, fd::numeric_gradient(w, loss), 1e-8));
}

// Weight gradients reduce over rows; 1000 rows span several fixed chunks.
TEST(LayerNorm, WeightGradientIsBitwiseIdenticalForOneAndTwoThreads) {
  const int64_t N = 1000, C = 96;
  auto x = fd::random_vector<float>(N * C, 14);
  auto w = fd::random_vector<float>(C, 15);
  auto dout = fd::random_vector<float>(N * C, 16);
  std::vector<float> out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), static_cast<const float*>(nullptr), N, C,
                    kEps);
  auto run = [&](int threads) {
    std::vector<float> grads(2 * C, 0.0f);
    fd::with_threads(threads, [&] {
      layernorm_backward_weight(grads.data(), grads.data() + C, dout.data(), x.data(), mean.data(), rstd.data(), N, C);
    });
    return grads;
  };
  EXPECT_TRUE(fd::same_bits(run(1), run(2)));
}

TEST(RmsNorm, WeightGradientIsBitwiseIdenticalForOneAndTwoThreads) {
  const int64_t N = 1000, C = 96;
  auto x = fd::random_vector<float>(N * C, 17);
  auto w = fd::random_vector<float>(C, 18);
  auto dout = fd::random_vector<float>(N * C, 19);
  std::vector<float> out(N * C), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, kEps);
  auto run = [&](int threads) {
    std::vector<float> dw(C, 0.0f);
    fd::with_threads(threads, [&] { rmsnorm_backward_weight(dw.data(), dout.data(), x.data(), rstd.data(), N, C); });
    return dw;
  };
  EXPECT_TRUE(fd::same_bits(run(1), run(2)));
}

// The residual add fused into the norm (add_*_forward, dresidual): in double the gradients of
// loss = sum(dout * out) + sum(dsum * (x + residual)) match finite differences, with dx = the
// norm's input gradient + dsum, the residual stream's own gradient; in f32 the forward is bitwise
// the unfused composition (residual add, then norm) and the input gradient (norm backward, then
// residual add) equal to rounding: the add joins the norm's last expression, which may become an FMA.
namespace {

void add_norm_forward(bool rms, double* sum, double* out, double* mean, double* rstd, const double* x,
                      const double* res, const double* w, const double* b) {
  if (rms)
    add_rmsnorm_forward(sum, out, rstd, x, res, w, kN, kC, kEps);
  else
    add_layernorm_forward(sum, out, mean, rstd, x, res, w, b, kN, kC, kEps);
}

}  // namespace

TEST(AddNorm, GradientsMatchFiniteDifferences) {
  for (const bool rms : {false, true}) {
    SCOPED_TRACE(rms ? "rmsnorm" : "layernorm");
    auto x = fd::random_vector(kN * kC, 20, -2.0, 3.0);
    auto res = fd::random_vector(kN * kC, 21, -1.0, 1.0);
    auto w = fd::random_vector(kC, 22);
    auto b = fd::random_vector(kC, 23);
    auto dout = fd::random_vector(kN * kC, 24);
    auto dsum = fd::random_vector(kN * kC, 25);
    std::vector<double> sum(x.size()), out(x.size()), mean(kN), rstd(kN);
    auto loss = [&] {
      add_norm_forward(rms, sum.data(), out.data(), mean.data(), rstd.data(), x.data(), res.data(), w.data(), b.data());
      return fd::dot(dout, out) + fd::dot(dsum, sum);
    };
    loss();
    std::vector<double> dx(x.size(), 123.0);
    if (rms)
      rmsnorm_backward_input(dx.data(), dout.data(), sum.data(), w.data(), rstd.data(), kN, kC, dsum.data());
    else
      layernorm_backward_input(dx.data(), dout.data(), sum.data(), w.data(), mean.data(), rstd.data(), kN, kC,
                               dsum.data());
    // x and the residual are summed, so both get the same gradient.
    EXPECT_TRUE(fd::close(dx, fd::numeric_gradient(x, loss), 1e-8));
    EXPECT_TRUE(fd::close(dx, fd::numeric_gradient(res, loss), 1e-8));
  }
}

TEST(AddNorm, F32MatchesTheUnfusedResidualAddAndNorm) {
  const int64_t N = 300, C = 96;
  auto x = fd::random_vector<float>(N * C, 26, -2.0, 3.0);
  auto res = fd::random_vector<float>(N * C, 27);
  auto w = fd::random_vector<float>(C, 28);
  auto b = fd::random_vector<float>(C, 29);
  auto dout = fd::random_vector<float>(N * C, 30);
  auto dres = fd::random_vector<float>(N * C, 31);
  for (const bool rms : {false, true}) {
    SCOPED_TRACE(rms ? "rmsnorm" : "layernorm");
    // Unfused: sum = x + res, out = norm(sum); dx = norm'(dout) + dres.
    std::vector<float> sum(N * C), out(N * C), mean(N), rstd(N), dx(N * C);
    for (int64_t i = 0; i < N * C; ++i) sum[i] = x[i] + res[i];
    if (rms) {
      rmsnorm_forward(out.data(), rstd.data(), sum.data(), w.data(), N, C, kEps);
      rmsnorm_backward_input(dx.data(), dout.data(), sum.data(), w.data(), rstd.data(), N, C);
    } else {
      layernorm_forward(out.data(), mean.data(), rstd.data(), sum.data(), w.data(), b.data(), N, C, kEps);
      layernorm_backward_input(dx.data(), dout.data(), sum.data(), w.data(), mean.data(), rstd.data(), N, C);
    }
    for (int64_t i = 0; i < N * C; ++i) dx[i] += dres[i];
    // Fused, the sum written over x's own copy (the block's in-place use).
    std::vector<float> fsum = x, fout(N * C), fmean(N), frstd(N), fdx(N * C);
    if (rms) {
      add_rmsnorm_forward(fsum.data(), fout.data(), frstd.data(), fsum.data(), res.data(), w.data(), N, C, kEps);
      rmsnorm_backward_input(fdx.data(), dout.data(), fsum.data(), w.data(), frstd.data(), N, C, dres.data());
    } else {
      add_layernorm_forward(fsum.data(), fout.data(), fmean.data(), frstd.data(), fsum.data(), res.data(), w.data(),
                            b.data(), N, C, kEps);
      layernorm_backward_input(fdx.data(), dout.data(), fsum.data(), w.data(), fmean.data(), frstd.data(), N, C,
                               dres.data());
    }
    EXPECT_TRUE(fd::same_bits(fsum, sum));
    EXPECT_TRUE(fd::same_bits(fout, out));
    EXPECT_TRUE(fd::same_bits(frstd, rstd));
    if (!rms) {
      EXPECT_TRUE(fd::same_bits(fmean, mean));
    }
    EXPECT_TRUE(fd::close(std::vector<double>(fdx.begin(), fdx.end()), std::vector<double>(dx.begin(), dx.end()), 1e-6));
  }
}
