#include "megaton/optim/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "megaton/core/threads.h"

using namespace megaton;
using megaton::optim::AdamW;
using megaton::optim::AdamWConfig;

namespace {

nn::Parameter scalar_param(std::string name, float value, bool decay) {
  nn::Parameter p(std::move(name), {1}, decay);
  p.value.data<float>()[0] = value;
  return p;
}

void fill_random(Tensor& t, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  float* d = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) d[i] = dist(rng);
}

// Independent double-precision transcription of torch.optim.AdamW's update for one element.
struct RefAdamW {
  double beta1, beta2, eps, wd;
  void step(double& p, double& m, double& v, double g, double lr, int64_t t, bool decay) const {
    if (decay) p -= lr * wd * p;
    m = beta1 * m + (1 - beta1) * g;
    v = beta2 * v + (1 - beta2) * g * g;
    const double mhat = m / (1 - std::pow(beta1, t));
    const double vhat = v / (1 - std::pow(beta2, t));
    p -= lr * mhat / (std::sqrt(vhat) + eps);
  }
};

}  // namespace

// Hand-derived: with a constant gradient, mhat = g and vhat = g^2 at every step (bias correction
// cancels the zero initialisation exactly), so each step moves p by lr * g / (|g| + eps) ~= lr.
TEST(AdamW, ConstantGradMovesByLrEachStep) {
  nn::Parameter p = scalar_param("w", 1.0f, false);
  AdamW opt({&p}, AdamWConfig{});
  p.grad.data<float>()[0] = 1.0f;
  opt.step(0.1);
  EXPECT_NEAR(p.value.data<float>()[0], 0.9f, 1e-6);
  opt.step(0.1);
  EXPECT_NEAR(p.value.data<float>()[0], 0.8f, 1e-6);
  EXPECT_EQ(opt.steps(), 2);
  // m = 0.9 * 0.1 + 0.1 = 0.19, v = 0.95 * 0.05 + 0.05 = 0.0975.
  EXPECT_NEAR(opt.exp_avg(0).data<float>()[0], 0.19f, 1e-7);
  EXPECT_NEAR(opt.exp_avg_sq(0).data<float>()[0], 0.0975f, 1e-7);
}

// Hand-derived bias correction: g = +1 then g = -1 with b1 = 0.9, b2 = 0.95.
// Step 2: m = 0.09 - 0.1 = -0.01, mhat = -0.01 / 0.19 = -1/19; v = 0.0975, vhat = 1.
// So p = 1 - 0.1 + 0.1 / 19.
TEST(AdamW, BiasCorrectionSecondStep) {
  nn::Parameter p = scalar_param("w", 1.0f, false);
  AdamW opt({&p}, AdamWConfig{});
  p.grad.data<float>()[0] = 1.0f;
  opt.step(0.1);
  p.grad.data<float>()[0] = -1.0f;
  opt.step(0.1);
  EXPECT_NEAR(p.value.data<float>()[0], 1.0 - 0.1 + 0.1 / 19.0, 1e-6);
}

// Hand-derived decoupled decay: p = 2 * (1 - 0.1 * 0.1) - 0.1 = 1.88 with decay, 1.9 without.
TEST(AdamW, WeightDecayOnlyOnFlaggedParams) {
  nn::Parameter decayed = scalar_param("w", 2.0f, true);
  nn::Parameter kept = scalar_param("b", 2.0f, false);
  decayed.grad.data<float>()[0] = 0.5f;
  kept.grad.data<float>()[0] = 0.5f;
  AdamW opt({&decayed, &kept}, AdamWConfig{.weight_decay = 0.1});
  opt.step(0.1);
  EXPECT_NEAR(decayed.value.data<float>()[0], 1.88f, 1e-6);
  EXPECT_NEAR(kept.value.data<float>()[0], 1.9f, 1e-6);

  // With zero grads the Adam term vanishes (m = v = 0 stays 0/eps = 0): only decay acts.
  decayed.grad.zero_();
  kept.grad.zero_();
  AdamW fresh({&decayed, &kept}, AdamWConfig{.weight_decay = 0.1});
  fresh.step(0.1);
  EXPECT_NEAR(decayed.value.data<float>()[0], 1.88f * 0.99f, 1e-6);
  EXPECT_EQ(kept.value.data<float>()[0], 1.9f);
}

TEST(AdamW, MatchesDoubleReferenceOverManySteps) {
  const AdamWConfig cfg{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  const RefAdamW ref{cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay};
  nn::Parameter w("w", {64, 130}, true);  // > 4096 elements: exercises the parallel loop
  nn::Parameter b("b", {7}, false);
  nn::ParameterList params{&w, &b};
  std::mt19937 rng(1234);
  for (auto* p : params) fill_random(p->value, rng, 1.0f);

  std::vector<std::vector<double>> rp, rm, rv;
  for (auto* p : params) {
    const float* d = p->value.data<float>();
    rp.emplace_back(d, d + p->value.numel());
    rm.emplace_back(p->value.numel(), 0.0);
    rv.emplace_back(p->value.numel(), 0.0);
  }
  AdamW opt(params, cfg);
  for (int64_t t = 1; t <= 20; ++t) {
    const double lr = 1e-2 * (1.0 + 0.1 * static_cast<double>(t % 3));
    for (size_t k = 0; k < params.size(); ++k) {
      // Gradients of varied scale, including some far below eps-relevance and some large.
      fill_random(params[k]->grad, rng, t % 5 == 0 ? 1e-3f : 1.0f);
      const float* g = params[k]->grad.data<float>();
      for (size_t j = 0; j < rp[k].size(); ++j)
        ref.step(rp[k][j], rm[k][j], rv[k][j], g[j], lr, t, params[k]->weight_decay);
    }
    opt.step(lr);
  }
  // fp32 state vs double reference: the moments are EMAs of O(1) grads and can cancel to near zero,
  // so their error is bounded in absolute terms (a few fp32 ulps of the grad scale), p's relatively.
  for (size_t k = 0; k < params.size(); ++k) {
    const float* p = params[k]->value.data<float>();
    const float* m = opt.exp_avg(k).data<float>();
    const float* v = opt.exp_avg_sq(k).data<float>();
    for (size_t j = 0; j < rp[k].size(); ++j) {
      ASSERT_NEAR(p[j], rp[k][j], 1e-5 * (1 + std::abs(rp[k][j]))) << params[k]->name << "[" << j << "]";
      ASSERT_NEAR(m[j], rm[k][j], 1e-6 + 1e-5 * std::abs(rm[k][j])) << params[k]->name << "[" << j << "]";
      ASSERT_NEAR(v[j], rv[k][j], 1e-6 + 1e-5 * std::abs(rv[k][j])) << params[k]->name << "[" << j << "]";
    }
  }
}

TEST(AdamW, ThreadCountIndependent) {
  auto run = [](int threads) {
    set_num_threads(threads);
    nn::Parameter w("w", {100000}, true);
    std::mt19937 rng(7);
    fill_random(w.value, rng, 1.0f);
    AdamW opt({&w}, AdamWConfig{});
    for (int t = 0; t < 3; ++t) {
      fill_random(w.grad, rng, 1.0f);
      opt.step(1e-3);
    }
    return w.value.clone(MemCategory::Other);
  };
  const int saved = num_threads();
  Tensor one = run(1);
  Tensor four = run(4);
  set_num_threads(saved);
  EXPECT_EQ(std::memcmp(one.raw(), four.raw(), one.nbytes()), 0);
}

TEST(AdamW, StateTensorsAreNamedOptimizerMemory) {
  nn::Parameter w("layer.weight", {3, 2}, true);
  nn::Parameter b("layer.bias", {3}, false);
  AdamW opt({&w, &b}, AdamWConfig{});
  auto state = opt.state_tensors();
  ASSERT_EQ(state.size(), 4u);
  EXPECT_EQ(state[0].first, "layer.weight.exp_avg");
  EXPECT_EQ(state[1].first, "layer.weight.exp_avg_sq");
  EXPECT_EQ(state[2].first, "layer.bias.exp_avg");
  EXPECT_EQ(state[3].first, "layer.bias.exp_avg_sq");
  for (auto& [name, t] : state) {
    EXPECT_EQ(t.category(), MemCategory::Optimizer) << name;
    EXPECT_EQ(t.dtype(), DType::F32) << name;
  }
  EXPECT_EQ(state[0].second.shape(), (Shape{3, 2}));
  EXPECT_EQ(state[0].second.raw(), opt.exp_avg(0).raw());  // shares storage: saving needs no copy
}

TEST(AdamW, RejectsDuplicateParameterNames) {
  nn::Parameter a("w", {2}, true);
  nn::Parameter b("w", {2}, true);
  EXPECT_THROW(AdamW({&a, &b}, AdamWConfig{}), Error);
}

// Saving after 3 steps and resuming in a fresh optimizer continues bit-identically.
TEST(AdamW, LoadStateResumesExactly) {
  std::mt19937 rng(99);
  nn::Parameter a("w", {5000}, true);
  fill_random(a.value, rng, 1.0f);
  AdamW opt_a({&a}, AdamWConfig{});
  for (int t = 0; t < 3; ++t) {
    fill_random(a.grad, rng, 1.0f);
    opt_a.step(1e-2);
  }
  nn::Parameter b("w", {5000}, true);
  b.value.copy_from(a.value);
  AdamW opt_b({&b}, AdamWConfig{});
  std::map<std::string, Tensor> saved;
  for (auto& [name, t] : opt_a.state_tensors()) saved[name] = t.clone(MemCategory::Other);
  opt_b.load_state(saved, opt_a.steps());
  EXPECT_EQ(opt_b.steps(), 3);

  fill_random(a.grad, rng, 1.0f);
  b.grad.copy_from(a.grad);
  opt_a.step(1e-2);
  opt_b.step(1e-2);
  EXPECT_EQ(std::memcmp(a.value.raw(), b.value.raw(), a.value.nbytes()), 0);
}

TEST(AdamW, LoadStateNamesMissingOrMisshapenTensor) {
  nn::Parameter w("layer.weight", {3, 2}, true);
  AdamW opt({&w}, AdamWConfig{});
  std::map<std::string, Tensor> state;
  state["layer.weight.exp_avg"] = Tensor::zeros({3, 2}, DType::F32);
  try {
    opt.load_state(state, 1);
    FAIL() << "missing exp_avg_sq accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer.weight.exp_avg_sq"), std::string::npos) << e.what();
  }
  state["layer.weight.exp_avg_sq"] = Tensor::zeros({2, 3}, DType::F32);
  try {
    opt.load_state(state, 1);
    FAIL() << "wrong shape accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer.weight.exp_avg_sq"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
  }
  EXPECT_EQ(opt.steps(), 0);  // failed loads leave the state untouched
}

// step(lr, s) must equal clipping the grads in place (g *= s) and then step(lr), bit for bit.
TEST(AdamW, GradScaleEqualsScalingTheGradsFirst) {
  std::mt19937 rng(5);
  nn::Parameter a("w", {3, 700}, true), b("w", {3, 700}, true);
  fill_random(a.value, rng, 1.0f);
  b.value.copy_from(a.value);
  AdamW opt_a({&a}, AdamWConfig{}), opt_b({&b}, AdamWConfig{});
  const float scale = 0.37f;
  for (int step = 0; step < 3; ++step) {
    fill_random(a.grad, rng, 2.0f);
    b.grad.copy_from(a.grad);
    for (int64_t j = 0; j < b.grad.numel(); ++j) b.grad.data<float>()[j] *= scale;
    opt_a.step(1e-2, scale);
    opt_b.step(1e-2);
  }
  EXPECT_EQ(std::memcmp(a.value.raw(), b.value.raw(), a.value.nbytes()), 0);
  EXPECT_EQ(std::memcmp(opt_a.exp_avg_sq(0).raw(), opt_b.exp_avg_sq(0).raw(), a.value.nbytes()), 0);
}
