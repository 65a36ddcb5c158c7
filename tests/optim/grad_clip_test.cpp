#include "megaton/optim/grad_clip.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "megaton/core/threads.h"

using namespace megaton;
using megaton::optim::clip_grad_norm;
using megaton::optim::global_grad_norm;

namespace {

// Two parameters whose grads are {3, 4} and {12}: global norm sqrt(9 + 16 + 144) = 13.
struct ThreeFourTwelve {
  nn::Parameter a{"a", {2}, true};
  nn::Parameter b{"b", {1}, false};
  nn::ParameterList list{&a, &b};
  ThreeFourTwelve() {
    a.grad.data<float>()[0] = 3.0f;
    a.grad.data<float>()[1] = 4.0f;
    b.grad.data<float>()[0] = 12.0f;
  }
};

}  // namespace

TEST(GradClip, GlobalNormOverAllParams) {
  ThreeFourTwelve p;
  EXPECT_DOUBLE_EQ(global_grad_norm(p.list), 13.0);
  EXPECT_EQ(global_grad_norm({}), 0.0);
}

TEST(GradClip, ClipScalesByMaxOverNormAndReturnsPreClipNorm) {
  ThreeFourTwelve p;
  EXPECT_DOUBLE_EQ(clip_grad_norm(p.list, 6.5), 13.0);
  const float scale = static_cast<float>(6.5 / (13.0 + 1e-6));
  EXPECT_EQ(p.a.grad.data<float>()[0], 3.0f * scale);
  EXPECT_EQ(p.a.grad.data<float>()[1], 4.0f * scale);
  EXPECT_EQ(p.b.grad.data<float>()[0], 12.0f * scale);
  EXPECT_NEAR(global_grad_norm(p.list), 6.5, 1e-5);
}

TEST(GradClip, NoClipBelowMaxOrWhenDisabled) {
  ThreeFourTwelve p;
  EXPECT_DOUBLE_EQ(clip_grad_norm(p.list, 20.0), 13.0);
  EXPECT_EQ(p.b.grad.data<float>()[0], 12.0f);
  EXPECT_DOUBLE_EQ(clip_grad_norm(p.list, 0.0), 13.0);
  EXPECT_DOUBLE_EQ(clip_grad_norm(p.list, -1.0), 13.0);
  EXPECT_EQ(p.a.grad.data<float>()[0], 3.0f);
  EXPECT_EQ(p.b.grad.data<float>()[0], 12.0f);
}

TEST(GradClip, NonFiniteGradsGiveNonFiniteNormAndAreLeftAlone) {
  ThreeFourTwelve p;
  p.a.grad.data<float>()[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(clip_grad_norm(p.list, 1.0)));
  EXPECT_EQ(p.b.grad.data<float>()[0], 12.0f);

  p.a.grad.data<float>()[1] = std::numeric_limits<float>::infinity();
  const double norm = clip_grad_norm(p.list, 1.0);
  EXPECT_TRUE(std::isinf(norm));
  EXPECT_EQ(p.b.grad.data<float>()[0], 12.0f);
}

TEST(GradClip, LargeFiniteGradsDoNotOverflow) {
  nn::Parameter w("w", {2}, true);
  w.grad.data<float>()[0] = 3e30f;
  w.grad.data<float>()[1] = 4e30f;  // squares overflow fp32 but not the double accumulator
  EXPECT_NEAR(global_grad_norm({&w}), 5e30, 1e24);
}

// Many chunks across several params: bit-identical for any thread count, and accurate.
TEST(GradClip, NormIsThreadCountIndependent) {
  nn::Parameter w1("w1", {300001}, true);
  nn::Parameter w2("w2", {77}, false);
  nn::Parameter w3("w3", {123457}, true);
  nn::ParameterList list{&w1, &w2, &w3};
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  long double ref = 0;
  for (auto* p : list) {
    float* g = p->grad.data<float>();
    for (int64_t i = 0; i < p->grad.numel(); ++i) {
      g[i] = dist(rng);
      ref += static_cast<long double>(g[i]) * g[i];
    }
  }
  const int saved = num_threads();
  set_num_threads(1);
  const double n1 = global_grad_norm(list);
  set_num_threads(3);
  const double n3 = global_grad_norm(list);
  set_num_threads(8);
  const double n8 = global_grad_norm(list);
  set_num_threads(saved);
  EXPECT_EQ(std::memcmp(&n1, &n3, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&n1, &n8, sizeof(double)), 0);
  EXPECT_NEAR(n1, static_cast<double>(std::sqrt(ref)), 1e-10 * n1);
}

TEST(GradClip, CoefficientMatchesWhatClipGradNormApplies) {
  EXPECT_DOUBLE_EQ(optim::clip_coefficient(13.0, 6.5), 6.5 / (13.0 + 1e-6));
  EXPECT_EQ(optim::clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_EQ(optim::clip_coefficient(50.0, 0.0), 1.0);  // clipping disabled
  EXPECT_EQ(optim::clip_coefficient(std::nan(""), 1.0), 1.0);
}
