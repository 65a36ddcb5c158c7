#include "megaton/kernels/cpu/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "finite_diff.h"

using namespace megaton;
using namespace megaton::kernels::cpu;

namespace {

constexpr int64_t kN = 17, kH = 37;

double gelu_reference(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

double silu_reference(double x) { return x / (1.0 + std::exp(-x)); }

}  // namespace

TEST(Gelu, ForwardMatchesTanhFormula) {
  auto x = fd::random_vector<double>(kN * kH, 1, -6.0, 6.0);
  x.insert(x.end(), {0.0, -30.0, 30.0, -100.0, 100.0});  // saturation: no NaN, exact limits
  std::vector<float> xf(x.begin(), x.end()), outf(x.size());
  std::vector<double> out(x.size());
  gelu_forward(out.data(), x.data(), static_cast<int64_t>(x.size()));
  gelu_forward(outf.data(), xf.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = gelu_reference(x[i]);
    EXPECT_NEAR(out[i], want, 1e-14 * (1.0 + std::abs(want))) << x[i];
    EXPECT_NEAR(outf[i], gelu_reference(xf[i]), 1e-6 * (1.0 + std::abs(want))) << x[i];
  }
}

TEST(Gelu, GradientMatchesFiniteDifferences) {
  auto x = fd::random_vector(kN * kH, 2, -4.0, 4.0);
  auto dout = fd::random_vector(x.size(), 3);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<double> out(x.size()), dx(x.size());
  auto loss = [&] {
    gelu_forward(out.data(), x.data(), n);
    return fd::dot(dout, out);
  };
  gelu_backward(dx.data(), dout.data(), x.data(), n);
  EXPECT_TRUE(fd::close(dx, fd::numeric_gradient(x, loss), 1e-8));
}

TEST(Swiglu, ForwardMatchesSiluTimesUp) {
  auto gu = fd::random_vector(kN * 2 * kH, 4, -10.0, 10.0);
  std::vector<float> guf(gu.begin(), gu.end()), outf(kN * kH);
  std::vector<double> out(kN * kH);
  swiglu_forward(out.data(), gu.data(), kN, kH);
  swiglu_forward(outf.data(), guf.data(), kN, kH);
  for (int64_t r = 0; r < kN; ++r)
    for (int64_t h = 0; h < kH; ++h) {
      const int64_t g = r * 2 * kH + h, u = g + kH;
      const double want = silu_reference(gu[g]) * gu[u];
      EXPECT_NEAR(out[r * kH + h], want, 1e-14 * (1.0 + std::abs(want)));
      EXPECT_NEAR(outf[r * kH + h], silu_reference(guf[g]) * guf[u], 1e-6 * (1.0 + std::abs(want)));
    }
}

TEST(Swiglu, GradientMatchesFiniteDifferences) {
  auto gu = fd::random_vector(kN * 2 * kH, 5, -4.0, 4.0);
  auto dout = fd::random_vector(kN * kH, 6);
  std::vector<double> out(kN * kH), dgu(gu.size(), 123.0);
  auto loss = [&] {
    swiglu_forward(out.data(), gu.data(), kN, kH);
    return fd::dot(dout, out);
  };
  swiglu_backward(dgu.data(), dout.data(), gu.data(), kN, kH);
  EXPECT_TRUE(fd::close(dgu, fd::numeric_gradient(gu, loss), 1e-8));
}

TEST(Activation, ResidualAllowsAliasing) {
  const int64_t n = 1001;
  auto a = fd::random_vector<float>(n, 7);
  auto b = fd::random_vector<float>(n, 8);
  std::vector<float> sum(n), in_place = a;
  residual_forward(sum.data(), a.data(), b.data(), n);
  residual_forward(in_place.data(), in_place.data(), b.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(sum[i], a[i] + b[i]);
    EXPECT_EQ(in_place[i], a[i] + b[i]);
  }
}

// The bias fused into the activation (bias_gelu_* / bias_swiglu_*): in double the gradients with
// respect to h and the bias match finite differences; in f32 forward and dh are bitwise the
// activation of the stored h + bias, and dbias bitwise bias_backward's column sums of that dh,
// for one thread and two (threads split the columns, so the row order of the sums never changes).
namespace {

// Runs the fused kernel of the activation (GeLU on [N, F], SwiGLU on [N, 2H] -> [N, H]).
template <typename T>
void bias_act_forward(bool swiglu, T* out, const T* h, const compute_t<T>* bias, int64_t N, int64_t H) {
  swiglu ? bias_swiglu_forward(out, h, bias, N, H) : bias_gelu_forward(out, h, bias, N, H);
}
template <typename T>
void bias_act_backward(bool swiglu, T* dh, compute_t<T>* dbias, const T* dout, const T* h, const compute_t<T>* bias,
                       int64_t N, int64_t H) {
  swiglu ? bias_swiglu_backward(dh, dbias, dout, h, bias, N, H) : bias_gelu_backward(dh, dbias, dout, h, bias, N, H);
}

}  // namespace

TEST(BiasActivation, GradientsMatchFiniteDifferences) {
  for (const bool swiglu : {false, true}) {
    SCOPED_TRACE(swiglu ? "swiglu" : "gelu");
    const int64_t F = swiglu ? 2 * kH : kH;
    auto h = fd::random_vector(kN * F, 40, -3.0, 3.0);
    auto bias = fd::random_vector(F, 41);
    auto dout = fd::random_vector(kN * kH, 42);
    std::vector<double> out(kN * kH), dh(h.size(), 123.0), dbias(F, 1.0);
    auto loss = [&] {
      bias_act_forward(swiglu, out.data(), h.data(), bias.data(), kN, kH);
      return fd::dot(dout, out);
    };
    bias_act_backward(swiglu, dh.data(), dbias.data(), dout.data(), h.data(), bias.data(), kN, kH);
    for (double& g : dbias) g -= 1.0;  // accumulated onto 1
    EXPECT_TRUE(fd::close(dh, fd::numeric_gradient(h, loss), 1e-8));
    EXPECT_TRUE(fd::close(dbias, fd::numeric_gradient(bias, loss), 1e-8));
  }
}

TEST(BiasActivation, F32IsBitwiseTheActivationOfHPlusBiasAndItsBiasSums) {
  const int64_t N = 301, H = 200;
  for (const bool swiglu : {false, true}) {
    SCOPED_TRACE(swiglu ? "swiglu" : "gelu");
    const int64_t F = swiglu ? 2 * H : H;
    auto h = fd::random_vector<float>(N * F, 43, -4.0, 4.0);
    auto bias = fd::random_vector<float>(F, 44);
    auto dout = fd::random_vector<float>(N * H, 45);
    // Unfused: the bias added first (as a GEMM with its bias would leave it), then the activation,
    // then the bias gradient as its own pass over dh.
    std::vector<float> hb(N * F), out(N * H), dh(N * F), dbias(F, 0.5f);
    for (int64_t i = 0; i < N * F; ++i) hb[i] = h[i] + bias[i % F];
    if (swiglu) {
      swiglu_forward(out.data(), hb.data(), N, H);
      swiglu_backward(dh.data(), dout.data(), hb.data(), N, H);
    } else {
      gelu_forward(out.data(), hb.data(), N * F);
      gelu_backward(dh.data(), dout.data(), hb.data(), N * F);
    }
    std::vector<float> acc(F, 0.0f);  // bias_backward's order: per column, over the rows in order

    for (int64_t n = 0; n < N; ++n)
      for (int64_t f = 0; f < F; ++f) acc[f] += dh[n * F + f];
    for (int64_t f = 0; f < F; ++f) dbias[f] += acc[f];
    for (const int threads : {1, 2}) {
      SCOPED_TRACE(threads);
      std::vector<float> fout(N * H), fdh(N * F), fdbias(F, 0.5f);
      fd::with_threads(threads, [&] {
        bias_act_forward(swiglu, fout.data(), h.data(), bias.data(), N, H);
        bias_act_backward(swiglu, fdh.data(), fdbias.data(), dout.data(), h.data(), bias.data(), N, H);
      });
      EXPECT_TRUE(fd::same_bits(fout, out));
      EXPECT_TRUE(fd::same_bits(fdh, dh));
      EXPECT_TRUE(fd::same_bits(fdbias, dbias));
    }
  }
}
