// The MoE kernels (kernels/moe.h) in double: permute / unpermute as exact inverses and with their
// backward, the grouped linear against per-expert products, every router and balancing-loss
// gradient against central differences, and capacity dropping.
#include "megaton/kernels/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "finite_diff.h"
#include "megaton/core/threads.h"

using namespace megaton;
using namespace megaton::kernels;

namespace {

const ExecContext kCpu{};

Tensor f64(const std::vector<double>& v, Shape shape) {
  Tensor t = Tensor::empty(shape, DType::F64, MemCategory::Other, "t");
  std::copy(v.begin(), v.end(), t.data<double>());
  return t;
}
Tensor i32(const std::vector<int32_t>& v, Shape shape) {
  Tensor t = Tensor::empty(shape, DType::I32, MemCategory::Other, "i");
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}
std::vector<double> values(const Tensor& t) { return {t.data<double>(), t.data<double>() + t.numel()}; }

// Routes N tokens of random logits to K of E experts (softmax) and plans a dropless dispatch.
struct Routed {
  int64_t N, E, K;
  Tensor indices, probs, pos;
  DispatchPlan plan;
};
Routed route_random(int64_t N, int64_t E, int64_t K, uint64_t seed) {
  Routed r{N, E, K, i32(std::vector<int32_t>(N * K), {N, K}), Tensor::empty({N, K}, DType::F32), i32(std::vector<int32_t>(N * K), {N, K}), {}};
  Tensor logits = Tensor::empty({N, E}, DType::F32);
  auto l = fd::random_vector<float>(static_cast<size_t>(N * E), seed, -2, 2);
  std::copy(l.begin(), l.end(), logits.data<float>());
  moe_route(kCpu, r.indices, r.probs, logits, Tensor{}, {E, K});
  r.plan = moe_dispatch_plan(kCpu, r.pos, r.indices, r.probs, E, -1, false);
  return r;
}

}  // namespace

TEST(MoePermute, UnpermuteWithUnitProbsInvertsPermute) {
  for (int64_t K : {1, 2}) {
    const Routed r = route_random(13, 5, K, 10 + K);
    const int64_t C = 7;
    auto x = fd::random_vector(static_cast<size_t>(r.N * C), 1);
    Tensor xt = f64(x, {r.N, C}), xp = Tensor::empty({r.plan.rows, C}, DType::F64), y = Tensor::empty({r.N, C}, DType::F64);
    moe_permute(kCpu, xp, xt, r.pos);
    // Rows are grouped by expert: every row of expert e's block is a token that selected e.
    moe_unpermute(kCpu, y, xp, r.pos, f64(std::vector<double>(static_cast<size_t>(r.N * K), 1.0 / K), {r.N, K}));
    std::vector<double> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = K == 1 ? x[i] : (x[i] / K + x[i] / K);
    EXPECT_TRUE(fd::same_bits(values(y), want)) << "K = " << K;
    EXPECT_EQ(r.plan.rows, r.N * K);
  }
}

TEST(MoePermute, RowsAreGroupedByExpertInTokenOrder) {
  const Routed r = route_random(11, 4, 2, 3);
  const int32_t* idx = r.indices.data<int32_t>();
  const int32_t* pos = r.pos.data<int32_t>();
  std::vector<int64_t> start(4, 0);
  for (int64_t e = 1; e < 4; ++e) start[e] = start[e - 1] + r.plan.rows_per_expert[e - 1];
  std::vector<int64_t> next = start;
  for (int64_t s = 0; s < r.N * r.K; ++s) EXPECT_EQ(pos[s], next[idx[s]]++) << "slot " << s;
}

TEST(MoePermute, GradientsMatchFiniteDifferences) {
  const Routed r = route_random(9, 4, 2, 5);
  const int64_t C = 6, M = r.plan.rows;
  auto x = fd::random_vector(static_cast<size_t>(r.N * C), 2);
  auto rows = fd::random_vector(static_cast<size_t>(M * C), 3);
  auto probs = fd::random_vector(static_cast<size_t>(r.N * r.K), 4, 0.1, 1.0);
  auto dxp = fd::random_vector(static_cast<size_t>(M * C), 5), dy = fd::random_vector(static_cast<size_t>(r.N * C), 6);
  Tensor out = Tensor::empty({M, C}, DType::F64), y = Tensor::empty({r.N, C}, DType::F64);
  auto permute_loss = [&] {
    moe_permute(kCpu, out, f64(x, {r.N, C}), r.pos);
    return fd::dot(dxp, values(out));
  };
  auto unpermute_loss = [&] {
    moe_unpermute(kCpu, y, f64(rows, {M, C}), r.pos, f64(probs, {r.N, r.K}));
    return fd::dot(dy, values(y));
  };
  Tensor dx = Tensor::empty({r.N, C}, DType::F64), drows = Tensor::empty({M, C}, DType::F64),
         dprobs = Tensor::empty({r.N, r.K}, DType::F64);
  moe_permute_backward(kCpu, dx, f64(dxp, {M, C}), r.pos);
  EXPECT_TRUE(fd::close(values(dx), fd::numeric_gradient(x, permute_loss), 1e-8));
  moe_unpermute_backward(kCpu, drows, dprobs, f64(dy, {r.N, C}), f64(rows, {M, C}), r.pos, f64(probs, {r.N, r.K}));
  EXPECT_TRUE(fd::close(values(drows), fd::numeric_gradient(rows, unpermute_loss), 1e-8));
  EXPECT_TRUE(fd::close(values(dprobs), fd::numeric_gradient(probs, unpermute_loss), 1e-8));
}

// bf16 and fp16 rows (the compute dtypes of mixed precision): every permutation and its backward
// against the f64 kernels on the same (rounded) inputs, to the format's rounding of one result.
TEST(MoePermute, HalfPrecisionRowsMatchDoubleToTheirRounding) {
  const Routed r = route_random(37, 4, 2, 7);
  const int64_t C = 40, M = r.plan.rows, N = r.N, K = r.K;
  for (const DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    const double tol = dt == DType::BF16 ? 1e-2 : 2e-3;
    auto rounded = [&](Shape shape, uint64_t seed, double lo = -1.0) {  // f64 values exact in dt
      Tensor t = Tensor::empty(shape, DType::F32);
      const auto v = fd::random_vector<float>(static_cast<size_t>(t.numel()), seed, lo, 1.0);
      std::copy(v.begin(), v.end(), t.data<float>());
      return t.to(dt).to(DType::F64);
    };
    const Tensor x = rounded({N, C}, 20), rows = rounded({M, C}, 21), probs = rounded({N, K}, 22, 0.1);
    const Tensor dxp = rounded({M, C}, 23), dy = rounded({N, C}, 24);
    auto both = [&](auto&& op, std::vector<Shape> outs, std::vector<Tensor> ins) {
      std::vector<Tensor> o64, o16, i16;
      for (const Shape& s : outs) o64.push_back(Tensor::empty(s, DType::F64)), o16.push_back(Tensor::empty(s, dt));
      for (const Tensor& t : ins) i16.push_back(t.to(dt));
      op(o64, ins);
      op(o16, i16);
      for (size_t i = 0; i < o64.size(); ++i)
        EXPECT_TRUE(fd::close_elementwise(values(o16[i].to(DType::F64)), values(o64[i]), tol, 1e-3)) << "output " << i;
    };
    both([&](auto& o, auto& in) { moe_permute(kCpu, o[0], in[0], r.pos); }, {{M, C}}, {x});
    both([&](auto& o, auto& in) { moe_permute_backward(kCpu, o[0], in[0], r.pos); }, {{N, C}}, {dxp});
    both([&](auto& o, auto& in) { moe_unpermute(kCpu, o[0], in[0], r.pos, in[1]); }, {{N, C}}, {rows, probs});
    both([&](auto& o, auto& in) { moe_unpermute_backward(kCpu, o[0], o[1], in[0], in[1], r.pos, in[2]); },
         {{M, C}, {N, K}}, {dy, rows, probs});
  }
}

TEST(MoePermute, PositionOutsideThePermutedRowsIsAnError) {
  Tensor x = Tensor::zeros({2, 3}, DType::F64), out = Tensor::zeros({2, 3}, DType::F64);
  EXPECT_THROW(moe_permute(kCpu, out, x, i32({0, 2}, {2, 1})), Error);
}

TEST(GroupedLinear, MatchesPerExpertProductsAndGradients) {
  const std::vector<int64_t> blocks = {3, 0, 5, 2};  // an expert without tokens too
  const int64_t M = 10, I = 4, O = 3, E = 4;
  auto x = fd::random_vector(static_cast<size_t>(M * I), 7), w = fd::random_vector(static_cast<size_t>(E * O * I), 8);
  auto dout = fd::random_vector(static_cast<size_t>(M * O), 9);
  Tensor out = Tensor::empty({M, O}, DType::F64);
  auto loss = [&] {
    grouped_linear_forward(kCpu, out, f64(x, {M, I}), f64(w, {E * O, I}), blocks);
    return fd::dot(dout, values(out));
  };
  loss();
  std::vector<double> want(static_cast<size_t>(M * O));
  for (int64_t e = 0, row = 0; e < E; ++e)
    for (int64_t n = 0; n < blocks[e]; ++n, ++row)
      for (int64_t o = 0; o < O; ++o) {
        double s = 0;
        for (int64_t i = 0; i < I; ++i) s += x[row * I + i] * w[(e * O + o) * I + i];
        want[row * O + o] = s;
      }
  EXPECT_TRUE(fd::close(values(out), want, 1e-14));
  Tensor dx = Tensor::empty({M, I}, DType::F64), dw = Tensor::zeros({E * O, I}, DType::F64);
  grouped_linear_backward_input(kCpu, dx, f64(dout, {M, O}), f64(w, {E * O, I}), blocks);
  grouped_linear_backward_weight(kCpu, dw, f64(dout, {M, O}), f64(x, {M, I}), blocks);
  EXPECT_TRUE(fd::close(values(dx), fd::numeric_gradient(x, loss), 1e-8));
  EXPECT_TRUE(fd::close(values(dw), fd::numeric_gradient(w, loss), 1e-8));
  EXPECT_THROW(grouped_linear_forward(kCpu, out, f64(x, {M, I}), f64(w, {E * O, I}), {3, 0, 5, 1}), Error);
}

// The experts' GEMMs side by side (one thread each) give what they give one after another (every
// thread on each), in f32 and bf16, forward and both backwards; an error inside the parallel region
// comes out as an Error.
TEST(GroupedLinear, SideBySideGivesWhatOneAfterAnotherGives) {
  const int before = num_threads();
  set_num_threads(2);
  const std::vector<int64_t> blocks = {37, 0, 5, 64, 1, 19, 40, 2};
  const int64_t M = std::accumulate(blocks.begin(), blocks.end(), int64_t{0}), I = 24, O = 40;
  const int64_t E = static_cast<int64_t>(blocks.size());
  for (DType dt : {DType::F32, DType::BF16}) {
    const auto rnd = [&](Shape shape, uint64_t seed) {
      const auto v = fd::random_vector<float>(static_cast<size_t>(shape_numel(shape)), seed, -1, 1);
      Tensor t = Tensor::empty(shape, DType::F32);
      std::copy(v.begin(), v.end(), t.data<float>());
      return t.to(dt, MemCategory::Other);
    };
    const Tensor x = rnd({M, I}, 1), w = rnd({E * O, I}, 2), dout = rnd({M, O}, 3);
    std::vector<Tensor> got;
    for (bool grouped : {true, false}) {
      Tensor out = Tensor::empty({M, O}, dt), dx = Tensor::empty({M, I}, dt), dw = Tensor::zeros({E * O, I}, DType::F32);
      grouped_linear_forward(kCpu, out, x, w, blocks, grouped);
      grouped_linear_backward_input(kCpu, dx, dout, w, blocks, grouped);
      grouped_linear_backward_weight(kCpu, dw, dout, x, blocks, grouped);
      for (const Tensor& t : {out, dx, dw}) got.push_back(t.to(DType::F32, MemCategory::Other));
    }
    for (size_t k = 0; k < 3; ++k) {
      const Tensor& a = got[k];
      const Tensor& b = got[k + 3];
      for (int64_t i = 0; i < a.numel(); ++i)
        ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]) << dtype_name(dt) << " result " << k << " element " << i;
    }
    // w in another dtype than x: linear_forward refuses it inside the region.
    Tensor out = Tensor::empty({M, O}, dt);
    EXPECT_THROW(grouped_linear_forward(kCpu, out, x, w.to(dt == DType::F32 ? DType::BF16 : DType::F32, MemCategory::Other),
                                        blocks, true),
                 Error);
  }
  set_num_threads(before);
}

namespace {
// d(sum dprobs * probs(logits)) / d logits through moe_route with the selection held fixed (random
// logits: no selection flips within the difference step).
void check_route_gradient(const RouterOptions& o, const std::vector<double>& bias, uint64_t seed) {
  const int64_t N = 6, E = o.experts, K = o.topk;
  auto logits = fd::random_vector(static_cast<size_t>(N * E), seed, -2, 2);
  auto dprobs = fd::random_vector(static_cast<size_t>(N * K), seed + 1);
  Tensor idx = i32(std::vector<int32_t>(N * K), {N, K}), probs = Tensor::empty({N, K}, DType::F64);
  const Tensor b = bias.empty() ? Tensor{} : f64(bias, {E});
  moe_route(kCpu, idx, probs, f64(logits, {N, E}), b, o);
  const std::vector<int32_t> chosen(idx.data<int32_t>(), idx.data<int32_t>() + N * K);
  auto loss = [&] {
    moe_route(kCpu, idx, probs, f64(logits, {N, E}), b, o);
    EXPECT_TRUE(std::equal(chosen.begin(), chosen.end(), idx.data<int32_t>())) << "selection flipped";
    return fd::dot(dprobs, values(probs));
  };
  Tensor dl = Tensor::empty({N, E}, DType::F64);
  moe_route_backward(kCpu, dl, f64(dprobs, {N, K}), f64(logits, {N, E}), idx, o);
  EXPECT_TRUE(fd::close(values(dl), fd::numeric_gradient(logits, loss), 1e-8));
}
}  // namespace

TEST(MoeRoute, SoftmaxGradientsMatchFiniteDifferences) {
  check_route_gradient({8, 2, false, true, 1, 1, false, 1.0}, {}, 20);      // Megatron pre-softmax
  check_route_gradient({8, 2, false, true, 1, 1, true, 1.0}, {}, 22);       // Mixtral: renormalised
  check_route_gradient({8, 3, false, false, 1, 1, false, 2.0}, {}, 24);     // softmax over the k, scaled
}

TEST(MoeRoute, SigmoidGroupLimitedWithBiasGradientsMatchFiniteDifferences) {
  check_route_gradient({8, 2, true, true, 4, 2, true, 2.5}, fd::random_vector(8, 30, -0.3, 0.3), 26);
}

TEST(MoeRoute, GroupLimitedSelectionStaysInTheBestGroups) {
  // 8 experts in 4 groups; group scores (top-2 sums): g0 0.9+0.8, g1 1.0+0.0, g2 0.5+0.5, g3 0.7+0.6.
  // topk_groups 2 keeps g0 and g3: expert 2 (1.0, best single score) is not eligible.
  const std::vector<double> scores = {0.9, 0.8, 1.0, 0.0, 0.5, 0.5, 0.7, 0.6};
  std::vector<double> logits(8);
  for (size_t e = 0; e < 8; ++e) logits[e] = std::log(scores[e] / (1 - scores[e] + 1e-300) + 1e-300);
  logits[2] = 30.0, logits[3] = -30.0;  // sigmoid 1.0 and 0.0
  Tensor idx = i32({0, 0, 0}, {1, 3}), probs = Tensor::empty({1, 3}, DType::F64);
  moe_route(kCpu, idx, probs, f64(logits, {1, 8}), Tensor{}, {8, 3, true, true, 4, 2, false, 1.0});
  EXPECT_EQ(std::vector<int32_t>(idx.data<int32_t>(), idx.data<int32_t>() + 3), (std::vector<int32_t>{0, 1, 6}));
  // The bias steers selection, never the weights.
  std::vector<double> bias(8, 0.0);
  bias[7] = 0.5;
  Tensor idx1 = i32({0}, {1, 1}), probs1 = Tensor::empty({1, 1}, DType::F64);
  moe_route(kCpu, idx1, probs1, f64(logits, {1, 8}), f64(bias, {8}), {8, 1, true, true, 4, 2, false, 1.0});
  EXPECT_EQ(idx1.data<int32_t>()[0], 7);
  EXPECT_NEAR(probs1.data<double>()[0], 0.6, 1e-12);
}

TEST(MoeRoute, InvalidOptionsAreErrors) {
  EXPECT_THROW(check_router_options({8, 9, false, true, 1, 1, false, 1.0}), Error);  // k > experts
  EXPECT_THROW(check_router_options({8, 2, false, true, 3, 1, false, 1.0}), Error);  // groups do not divide
  EXPECT_THROW(check_router_options({8, 5, true, true, 4, 2, false, 1.0}), Error);   // k > eligible experts
  EXPECT_THROW(check_router_options({8, 2, true, true, 4, 2, false, 0.0}), Error);   // scaling 0
}

TEST(MoeBalance, AuxAndSequenceLossGradientsMatchFiniteDifferences) {
  const int64_t N = 8, E = 4, K = 2;
  const Routed r = route_random(N, E, K, 40);
  for (bool sigmoid : {false, true})
    for (int64_t group_rows : {N, int64_t{4}}) {
      auto logits = fd::random_vector(static_cast<size_t>(N * E), 41, -2, 2);
      Tensor scores = Tensor::empty({N, E}, DType::F64), ds = Tensor::empty({N, E}, DType::F64);
      auto loss = [&] {
        moe_balance_scores(kCpu, scores, f64(logits, {N, E}), sigmoid);
        return moe_balance_loss(kCpu, ds, scores, r.indices, group_rows, 0.3, 1.0);
      };
      loss();
      Tensor dl = Tensor::zeros({N, E}, DType::F64);
      moe_balance_scores_backward(kCpu, dl, ds, f64(logits, {N, E}), sigmoid);
      EXPECT_TRUE(fd::close(values(dl), fd::numeric_gradient(logits, loss), 1e-8))
          << "sigmoid " << sigmoid << ", group_rows " << group_rows;
    }
}

TEST(MoeBalance, UniformRoutingGivesTheCoefficient) {
  // Each expert chosen equally often with uniform scores: Switch's loss is exactly coeff.
  const int64_t N = 4, E = 4, K = 1;
  Tensor scores = f64(std::vector<double>(N * E, 0.25), {N, E}), ds = Tensor::empty({N, E}, DType::F64);
  EXPECT_NEAR(moe_balance_loss(kCpu, ds, scores, i32({0, 1, 2, 3}, {N, K}), N, 0.01, 1.0), 0.01, 1e-15);
}

TEST(MoeZLoss, GradientMatchesFiniteDifferences) {
  const int64_t N = 5, E = 6;
  auto logits = fd::random_vector(static_cast<size_t>(N * E), 50, -3, 3);
  auto loss = [&] { return moe_z_loss(kCpu, Tensor{}, f64(logits, {N, E}), 0.1, 0.0); };
  Tensor dl = Tensor::zeros({N, E}, DType::F64);
  moe_z_loss(kCpu, dl, f64(logits, {N, E}), 0.1, 1.0);
  EXPECT_TRUE(fd::close(values(dl), fd::numeric_gradient(logits, loss), 1e-8));
}

TEST(MoeDispatch, CapacityDropsTheLowestProbsOrTheLatestTokens) {
  // 4 tokens all on expert 0 (K = 1), capacity 2.
  Tensor idx = i32({0, 0, 0, 0}, {4, 1}), pos = i32({0, 0, 0, 0}, {4, 1});
  Tensor probs = Tensor::empty({4, 1}, DType::F32);
  std::vector<float> p = {0.2f, 0.9f, 0.5f, 0.7f};
  std::copy(p.begin(), p.end(), probs.data<float>());
  DispatchPlan plan = moe_dispatch_plan(kCpu, pos, idx, probs, 2, 2, false);
  EXPECT_EQ(plan.dropped, 2);
  EXPECT_EQ(plan.rows_per_expert, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(std::vector<int32_t>(pos.data<int32_t>(), pos.data<int32_t>() + 4), (std::vector<int32_t>{-1, 0, -1, 1}));
  plan = moe_dispatch_plan(kCpu, pos, idx, probs, 2, 2, true);
  EXPECT_EQ(std::vector<int32_t>(pos.data<int32_t>(), pos.data<int32_t>() + 4), (std::vector<int32_t>{0, 1, -1, -1}));
  EXPECT_EQ(moe_dispatch_plan(kCpu, pos, idx, probs, 2, -1, false).dropped, 0);  // dropless
}

std::vector<int32_t> ints(const Tensor& t) { return {t.data<int32_t>(), t.data<int32_t>() + t.numel()}; }

// Expert parallelism's plans: the slots a token keeps, one rank's rows of the gathered slots, and the
// source-major -> expert-major reordering of received rows.
TEST(MoeDispatch, KeptExpertsMarkDroppedSlots) {
  Tensor idx = i32({3, 1, 0, 2}, {2, 2}), pos = i32({0, -1, 1, 2}, {2, 2}), sel = i32({9, 9, 9, 9}, {2, 2});
  moe_kept_experts(kCpu, sel, idx, pos);
  EXPECT_EQ(ints(sel), (std::vector<int32_t>{3, -1, 0, 2}));
}

TEST(MoeDispatch, LocalPlanGroupsThisRanksExpertsInSlotOrder) {
  // Experts 2 and 3 are this rank's; -1 is a dropped slot.
  Tensor sel = i32({3, 0, 2, 3, -1, 2, 1, 3}, {4, 2}), pos = i32(std::vector<int32_t>(8), {4, 2});
  const DispatchPlan plan = moe_local_plan(kCpu, pos, sel, 2, 2);
  EXPECT_EQ(plan.rows_per_expert, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(plan.rows, 5);
  EXPECT_EQ(plan.dropped, 0);
  EXPECT_EQ(ints(pos), (std::vector<int32_t>{2, -1, 0, 3, -1, 1, -1, 4}));
  EXPECT_THROW(moe_local_plan(kCpu, pos, i32({-2, 0, 0, 0, 0, 0, 0, 0}, {4, 2}), 0, 2), Error);
}

TEST(MoeDispatch, SortByExpertTurnsSourceMajorIntoExpertMajor) {
  // 2 sources x 2 experts: source 0 sends 1 row to expert 0 and 2 to expert 1, source 1 sends 2 and 0.
  Tensor pos = i32(std::vector<int32_t>(5), {5, 1});
  moe_sort_by_expert(kCpu, pos, {1, 2, 2, 0}, 2, 2);
  // Expert-major: [e0 s0 (1 row), e0 s1 (2 rows), e1 s0 (2 rows)].
  EXPECT_EQ(ints(pos), (std::vector<int32_t>{0, 3, 4, 1, 2}));
  // Permute then its backward is the identity on the rows.
  const int64_t C = 3;
  Tensor x = Tensor::empty({5, C}, DType::F64), sorted = Tensor::empty({5, C}, DType::F64),
         back = Tensor::empty({5, C}, DType::F64);
  for (int64_t i = 0; i < 5 * C; ++i) x.data<double>()[i] = static_cast<double>(i);
  moe_permute(kCpu, sorted, x, pos);
  EXPECT_EQ(sorted.data<double>()[3 * C], 3.0);  // received row 1 (source 0, expert 1) lands at row 3
  moe_permute_backward(kCpu, back, sorted, pos);
  for (int64_t i = 0; i < 5 * C; ++i) EXPECT_EQ(back.data<double>()[i], x.data<double>()[i]);
  EXPECT_THROW(moe_sort_by_expert(kCpu, pos, {1, 2, 2}, 2, 2), Error);
  EXPECT_THROW(moe_sort_by_expert(kCpu, pos, {1, 2, 2, 1}, 2, 2), Error);  // 6 rows for a [5, 1] pos
}
