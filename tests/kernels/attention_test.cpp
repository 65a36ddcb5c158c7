// Attention: the CPU templates (kernels::cpu, float and double) against a naive T x T attention
// and finite differences, and the tensor API (kernels::attention_forward / attention_backward)
// against the float template, bit for bit, with its checks.
#include "megaton/kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../support/host_tensors.h"
#include "../support/temp_dir.h"
#include "finite_diff.h"
#include "megaton/kernels/cpu/attention.h"
#include "megaton/nn/linear.h"  // as_dtype
#ifdef MEGATON_WITH_CUDA
#include "megaton/core/cuda/cuda_memory.h"
#endif

using namespace megaton;
using namespace megaton::kernels;

namespace {

// q, k and v of each token in one fused buffer in Megatron's per-query-group layout, as a fused QKV
// projection produces them: per kv group a block of [Hq / Hkv q heads | k head | v head] (+ pad).
// pad > 0 leaves unused columns after each group's heads, so the group stride is not implied by D.
// Dv > 0 gives the v heads (and the output's) their own size, as multi-latent attention has.
struct AttnShape {
  int64_t B, T, Hq, Hkv, D, pad = 0, Dv = 0;
  int64_t q_per_group() const { return Hq / Hkv; }
  int64_t dv() const { return Dv > 0 ? Dv : D; }
  HeadDim dims() const { return {D, dv()}; }
  int64_t group_stride() const { return (q_per_group() + 1) * D + dv() + pad; }
  int64_t stride() const { return Hkv * group_stride(); }
  HeadStrides fused() const { return {stride(), group_stride()}; }
  // Where query head h, and the k / v head of group g, start in a token's row.
  int64_t q_at(int64_t h) const { return h / q_per_group() * group_stride() + h % q_per_group() * D; }
  int64_t k_at(int64_t g) const { return g * group_stride() + k_offset(); }
  int64_t v_at(int64_t g) const { return g * group_stride() + v_offset(); }
  int64_t k_offset() const { return q_per_group() * D; }
  int64_t v_offset() const { return (q_per_group() + 1) * D; }
  size_t qkv_size() const { return B * T * stride(); }
  size_t out_size() const { return B * T * Hq * dv(); }
  size_t lse_size() const { return B * Hq * T; }
  double scale() const { return 1.0 / std::sqrt(double(D)); }
  bool is_pad(size_t i) const { return int64_t(i % group_stride()) >= (q_per_group() + 1) * D + dv(); }
};

template <typename To, typename From>
std::vector<To> convert(const std::vector<From>& v) {
  return std::vector<To>(v.begin(), v.end());
}

struct Result {
  std::vector<double> out, lse, dqkv;
};

// Full T x T causal softmax attention and its backward, in double, one query row at a time.
template <typename T>
Result naive_attention(const std::vector<T>& qkv, const std::vector<T>& dout, const AttnShape& s) {
  Result r{std::vector<double>(s.out_size()), std::vector<double>(s.lse_size()), std::vector<double>(qkv.size())};
  auto at = [&](int64_t b, int64_t t, int64_t offset) { return (b * s.T + t) * s.stride() + offset; };
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h) {
      const int64_t g = h / s.q_per_group(), qo = s.q_at(h), ko = s.k_at(g), vo = s.v_at(g);
      for (int64_t t = 0; t < s.T; ++t) {
        std::vector<double> p(t + 1);
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= t; ++j) {
          double dotqk = 0;
          for (int64_t d = 0; d < s.D; ++d) dotqk += double(qkv[at(b, t, qo + d)]) * qkv[at(b, j, ko + d)];
          p[j] = s.scale() * dotqk;
          mx = std::max(mx, p[j]);
        }
        for (double& x : p) sum += std::exp(x - mx);
        const double lse = mx + std::log(sum);
        r.lse[(b * s.Hq + h) * s.T + t] = lse;
        for (double& x : p) x = std::exp(x - lse);
        const int64_t orow = ((b * s.T + t) * s.Hq + h) * s.dv();
        std::vector<double> dp(t + 1);
        double di = 0;
        for (int64_t j = 0; j <= t; ++j) {
          for (int64_t d = 0; d < s.dv(); ++d) {
            r.out[orow + d] += p[j] * qkv[at(b, j, vo + d)];
            dp[j] += double(dout[orow + d]) * qkv[at(b, j, vo + d)];
          }
          di += p[j] * dp[j];
        }
        for (int64_t j = 0; j <= t; ++j) {
          const double ds = p[j] * (dp[j] - di);
          for (int64_t d = 0; d < s.D; ++d) {
            r.dqkv[at(b, t, qo + d)] += s.scale() * ds * qkv[at(b, j, ko + d)];
            r.dqkv[at(b, j, ko + d)] += s.scale() * ds * qkv[at(b, t, qo + d)];
          }
          for (int64_t d = 0; d < s.dv(); ++d) r.dqkv[at(b, j, vo + d)] += p[j] * dout[orow + d];
        }
      }
    }
  return r;
}

template <typename T>
void forward(std::vector<T>& out, std::vector<T>& lse, const std::vector<T>& qkv, const AttnShape& s) {
  const T* q = qkv.data();
  cpu::attention_forward(out.data(), lse.data(), q, q + s.k_offset(), q + s.v_offset(), s.B, s.T, s.Hq, s.Hkv,
                         s.dims(), s.fused(), s.fused(), s.scale());
}

// Kernel forward and backward; dqkv starts as NaN so that any element the backward should write but
// does not shows up.
template <typename T>
Result run_kernel(const std::vector<T>& qkv, const std::vector<T>& dout, const AttnShape& s) {
  std::vector<T> out(s.out_size()), lse(s.lse_size());
  std::vector<T> dqkv(qkv.size(), std::numeric_limits<T>::quiet_NaN());
  forward(out, lse, qkv, s);
  const T* q = qkv.data();
  T* dq = dqkv.data();
  cpu::attention_backward(dq, dq + s.k_offset(), dq + s.v_offset(), dout.data(), out.data(), lse.data(), q,
                          q + s.k_offset(), q + s.v_offset(), s.B, s.T, s.Hq, s.Hkv, s.dims(), s.fused(), s.fused(),
                          s.scale());
  return {convert<double>(out), convert<double>(lse), convert<double>(dqkv)};
}

// The padding columns of dqkv must be untouched (still NaN); zero them so the rest can be compared.
void expect_pad_untouched_then_clear(std::vector<double>& dqkv, const AttnShape& s) {
  for (size_t i = 0; i < dqkv.size(); ++i) {
    if (!s.is_pad(i)) continue;
    ASSERT_TRUE(std::isnan(dqkv[i])) << "padding element " << i << " was written";
    dqkv[i] = 0;
  }
}

// Loss = sum(dout * out); the gradient w.r.t. the whole fused buffer, q, k and v at once. The ~10^4
// tiny forwards run on one thread, where OpenMP fork/join cannot dominate on a busy machine (thread
// independence is tested separately).
void check_gradients(const AttnShape& s) {
  auto qkv = fd::random_vector(s.qkv_size(), 1, -2.0, 2.0);
  auto dout = fd::random_vector(s.out_size(), 2);
  std::vector<double> out(s.out_size()), lse(s.lse_size());
  auto loss = [&] {
    forward(out, lse, qkv, s);
    return fd::dot(dout, out);
  };
  const Result r = run_kernel(qkv, dout, s);
  std::vector<double> numeric;
  fd::with_threads(1, [&] { numeric = fd::numeric_gradient(qkv, loss); });
  EXPECT_TRUE(fd::close(r.dqkv, numeric, 1e-7));
}

void check_against_naive(const AttnShape& s, double tol, bool single) {
  auto qkv = fd::random_vector(s.qkv_size(), 3, -2.0, 2.0);
  auto dout = fd::random_vector(s.out_size(), 4);
  Result want = naive_attention(qkv, dout, s);
  Result got = single ? run_kernel(convert<float>(qkv), convert<float>(dout), s) : run_kernel(qkv, dout, s);
  expect_pad_untouched_then_clear(got.dqkv, s);
  EXPECT_TRUE(fd::close(got.out, want.out, tol));
  EXPECT_TRUE(fd::close(got.lse, want.lse, tol));
  EXPECT_TRUE(fd::close(got.dqkv, want.dqkv, tol));
}

// T = 150 spans three 64-row tiles, the last one partial; pad checks that only head slots are written.
const AttnShape kLongGqa{.B = 2, .T = 150, .Hq = 4, .Hkv = 2, .D = 64, .pad = 3};

using megaton::testing::tensor_of;
using megaton::testing::values;
using megaton::testing::zeros;

// The tensor API's training calls on a fused QKV tensor of shape s, as nn/attention.cpp makes them.
void forward_tensor(const ExecContext& ctx, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                    const AttnShape& s) {
  attention_forward(ctx, out, lse, qkv, {qkv, s.k_offset()}, {qkv, s.v_offset()}, s.B, s.T, s.Hq, s.Hkv, s.dims(),
                    s.fused(), s.fused(), s.scale());
}
void backward_tensor(const ExecContext& ctx, const Tensor& dqkv, const Tensor& dout, const Tensor& out,
                     const Tensor& lse, const Tensor& qkv, const AttnShape& s) {
  attention_backward(ctx, dqkv, {dqkv, s.k_offset()}, {dqkv, s.v_offset()}, dout, out, lse, qkv, {qkv, s.k_offset()},
                     {qkv, s.v_offset()}, s.B, s.T, s.Hq, s.Hkv, s.dims(), s.fused(), s.fused(), s.scale());
}

}  // namespace

TEST(Attention, GqaGradientsMatchFiniteDifferences) { check_gradients({.B = 2, .T = 17, .Hq = 6, .Hkv = 2, .D = 24}); }

TEST(Attention, MhaGradientsMatchFiniteDifferences) { check_gradients({.B = 2, .T = 17, .Hq = 2, .Hkv = 2, .D = 24}); }

TEST(Attention, MatchesNaiveInDouble) { check_against_naive(kLongGqa, 1e-12, false); }

TEST(Attention, MatchesNaiveInFloat) { check_against_naive(kLongGqa, 5e-6, true); }

// Multi-latent attention's shapes: value heads narrower than the q / k heads (nope + rope), and the
// absorbed decoding's one kv head with values wider than its keys' share of a vector register.
TEST(Attention, ValueHeadSizeOfItsOwnGradientsMatchFiniteDifferences) {
  check_gradients({.B = 2, .T = 13, .Hq = 3, .Hkv = 3, .D = 24, .Dv = 16});
  check_gradients({.B = 1, .T = 11, .Hq = 4, .Hkv = 1, .D = 12, .Dv = 20});
}

TEST(Attention, ValueHeadSizeOfItsOwnMatchesNaive) {
  const AttnShape s{.B = 2, .T = 150, .Hq = 4, .Hkv = 4, .D = 48, .pad = 3, .Dv = 32};
  check_against_naive(s, 1e-12, false);
  check_against_naive(s, 5e-6, true);
  check_against_naive({.B = 1, .T = 70, .Hq = 4, .Hkv = 1, .D = 40, .Dv = 72}, 5e-6, true);
}

// Decoding with a KV cache: the first 70 tokens as one chunk, then one token at a time, each chunk's
// queries gathered into their own contiguous [len, Hq, D] buffer and k/v read from the full fused
// buffer at pos_offset.
TEST(Attention, PosOffsetChunksMatchFullCausalForward) {
  const AttnShape s = kLongGqa;
  auto qkv = fd::random_vector<float>(s.qkv_size(), 5, -2.0, 2.0);
  std::vector<float> full_out(s.out_size()), full_lse(s.lse_size());
  forward(full_out, full_lse, qkv, s);

  std::vector<float> out(s.out_size()), lse(s.lse_size());
  const int64_t qw = s.Hq * s.D;
  auto run_chunk = [&](int64_t t0, int64_t len) {
    std::vector<float> q(s.B * len * qw), chunk_out(q.size()), chunk_lse(s.B * s.Hq * len);
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t t = 0; t < len; ++t)
        for (int64_t h = 0; h < s.Hq; ++h)
          std::copy_n(&qkv[(b * s.T + t0 + t) * s.stride() + s.q_at(h)], s.D, &q[((b * len + t) * s.Hq + h) * s.D]);
    const float* k = qkv.data() + s.k_offset();
    cpu::attention_forward(chunk_out.data(), chunk_lse.data(), q.data(), k, qkv.data() + s.v_offset(), s.B, len, s.Hq,
                           s.Hkv, s.D, {qw, s.q_per_group() * s.D}, s.fused(), s.scale(), t0, s.T * s.stride());
    for (int64_t b = 0; b < s.B; ++b) {
      std::copy_n(&chunk_out[b * len * qw], len * qw, &out[(b * s.T + t0) * qw]);
      for (int64_t h = 0; h < s.Hq; ++h)
        std::copy_n(&chunk_lse[(b * s.Hq + h) * len], len, &lse[(b * s.Hq + h) * s.T + t0]);
    }
  };
  const int64_t prefill = 70;
  run_chunk(0, prefill);
  for (int64_t t = prefill; t < s.T; ++t) run_chunk(t, 1);
  EXPECT_TRUE(fd::close(convert<double>(out), convert<double>(full_out), 1e-6));
  EXPECT_TRUE(fd::close(convert<double>(lse), convert<double>(full_lse), 1e-6));
}

TEST(Attention, BitwiseIdenticalForOneAndTwoThreads) {
  auto qkv = fd::random_vector<float>(kLongGqa.qkv_size(), 6, -2.0, 2.0);
  auto dout = fd::random_vector<float>(kLongGqa.out_size(), 7);
  auto run = [&](int threads) {
    Result r;
    fd::with_threads(threads, [&] { r = run_kernel(qkv, dout, kLongGqa); });
    return r;
  };
  const Result one = run(1), two = run(2);
  EXPECT_TRUE(fd::same_bits(one.out, two.out));
  EXPECT_TRUE(fd::same_bits(one.lse, two.lse));
  // NaN padding compares bitwise equal too (same payload), so the whole buffer can be compared.
  EXPECT_TRUE(fd::same_bits(one.dqkv, two.dqkv));
}

namespace {

using nn::as_dtype;

// v rounded to bf16 and widened back: the values a bf16 tensor of v holds.
std::vector<double> bf16_values(const std::vector<double>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_float(float_to_bf16(static_cast<float>(v[i])));
  return out;
}

Tensor bf16_tensor(const std::vector<double>& v, Shape shape, const std::string& name) {
  return as_dtype(tensor_of(convert<float>(v), std::move(shape), name), DType::BF16);
}

std::vector<double> doubles(const Tensor& t) { return convert<double>(values(as_dtype(t, DType::F32))); }

// The tensor API on bf16 tensors of the values of qkv / dout (bf16 already); dqkv starts as NaN.
Result run_bf16(const std::vector<double>& qkv, const std::vector<double>& dout, const AttnShape& s) {
  const ExecContext cpu_ctx;
  const Tensor QKV = bf16_tensor(qkv, {s.B * s.T, s.stride()}, "qkv");
  const Tensor DOUT = bf16_tensor(dout, {s.B * s.T, s.Hq * s.dv()}, "dout");
  Tensor OUT = zeros({s.B * s.T, s.Hq * s.dv()}, "out", DType::BF16), LSE = zeros({s.B, s.Hq, s.T}, "lse");
  Tensor DQKV = bf16_tensor(std::vector<double>(qkv.size(), std::numeric_limits<double>::quiet_NaN()),
                            {s.B * s.T, s.stride()}, "dqkv");
  forward_tensor(cpu_ctx, OUT, LSE, QKV, s);
  backward_tensor(cpu_ctx, DQKV, DOUT, OUT, LSE, QKV, s);
  return {doubles(OUT), convert<double>(values(LSE)), doubles(DQKV)};
}

// T = 300 spans three 128-row query blocks of the bf16 kernel, the last one partial; pad as kLongGqa.
const AttnShape kBf16Gqa{.B = 2, .T = 300, .Hq = 4, .Hkv = 2, .D = 64, .pad = 3};

}  // namespace

// bf16 attention (cpu/attention_bf16.h) against the double reference on the same bf16 values, with
// tolerances a few times the measured errors, on the scale of each result: its probabilities and dS are bf16
// GEMM operands and every output is rounded to bf16 (measured errors: out 2.5e-3, lse 7e-8, dqkv
// 2.9e-3 of the scale). GQA with padding, and MHA with a value head size of its own.
TEST(Attention, Bf16MatchesTheF64ReferenceWithinBf16Tolerance) {
  for (const AttnShape& s : {kBf16Gqa, AttnShape{.B = 1, .T = 140, .Hq = 2, .Hkv = 2, .D = 32, .Dv = 24}}) {
    const auto qkv = bf16_values(fd::random_vector(s.qkv_size(), 21, -2.0, 2.0));
    const auto dout = bf16_values(fd::random_vector(s.out_size(), 22));
    const Result want = naive_attention(qkv, dout, s);
    Result got = run_bf16(qkv, dout, s);
    expect_pad_untouched_then_clear(got.dqkv, s);
    EXPECT_TRUE(fd::close(got.out, want.out, 1e-2)) << "T " << s.T;
    EXPECT_TRUE(fd::close(got.lse, want.lse, 1e-6)) << "T " << s.T;
    EXPECT_TRUE(fd::close(got.dqkv, want.dqkv, 1e-2)) << "T " << s.T;
  }
}

// Each query row's result does not depend on how the rows were split over threads.
TEST(Attention, Bf16BitwiseIdenticalForOneAndTwoThreads) {
  const auto qkv = bf16_values(fd::random_vector(kBf16Gqa.qkv_size(), 23, -2.0, 2.0));
  const auto dout = bf16_values(fd::random_vector(kBf16Gqa.out_size(), 24));
  Result one, two;
  fd::with_threads(1, [&] { one = run_bf16(qkv, dout, kBf16Gqa); });
  fd::with_threads(2, [&] { two = run_bf16(qkv, dout, kBf16Gqa); });
  EXPECT_TRUE(fd::same_bits(one.out, two.out));
  EXPECT_TRUE(fd::same_bits(one.lse, two.lse));
  EXPECT_TRUE(fd::same_bits(one.dqkv, two.dqkv));
}

// The bf16 forward at pos_offset (k / v in caches with room for more tokens): a prefill of 170
// tokens, then 130 at once, equal within bf16 rounding to the full causal forward.
TEST(Attention, Bf16PosOffsetMatchesFullCausalForward) {
  const ExecContext cpu_ctx;
  const AttnShape s = kBf16Gqa;
  const auto qkv = bf16_values(fd::random_vector(s.qkv_size(), 25, -2.0, 2.0));
  const auto dout = bf16_values(fd::random_vector(s.out_size(), 26));
  const Result full = naive_attention(qkv, dout, s);
  const int64_t qw = s.Hq * s.D, kw = s.Hkv * s.D;
  std::vector<double> out(s.out_size()), lse(s.lse_size());
  // Heads gathered into contiguous q [len, Hq, D] and k / v caches [B, T, Hkv, D].
  std::vector<double> k(s.B * s.T * kw), v(k.size());
  for (int64_t r = 0; r < s.B * s.T; ++r)
    for (int64_t g = 0; g < s.Hkv; ++g) {
      std::copy_n(&qkv[r * s.stride() + s.k_at(g)], s.D, &k[r * kw + g * s.D]);
      std::copy_n(&qkv[r * s.stride() + s.v_at(g)], s.D, &v[r * kw + g * s.D]);
    }
  const Tensor K = bf16_tensor(k, {s.B, s.T, kw}, "k_cache"), V = bf16_tensor(v, {s.B, s.T, kw}, "v_cache");
  for (const auto& [t0, len] : {std::pair<int64_t, int64_t>{0, 170}, {170, 130}}) {
    std::vector<double> q(s.B * len * qw);
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t t = 0; t < len; ++t)
        for (int64_t h = 0; h < s.Hq; ++h)
          std::copy_n(&qkv[(b * s.T + t0 + t) * s.stride() + s.q_at(h)], s.D, &q[((b * len + t) * s.Hq + h) * s.D]);
    Tensor OUT = zeros({s.B * len, qw}, "out", DType::BF16), LSE = zeros({s.B, s.Hq, len}, "lse");
    attention_forward(cpu_ctx, OUT, LSE, bf16_tensor(q, {s.B * len, qw}, "q"), K, V, s.B, len, s.Hq, s.Hkv, s.D,
                      {qw, s.q_per_group() * s.D}, {kw, s.D}, s.scale(), t0, s.T * kw);
    const auto o = doubles(OUT), l = convert<double>(values(LSE));
    for (int64_t b = 0; b < s.B; ++b) {
      std::copy_n(&o[b * len * qw], len * qw, &out[(b * s.T + t0) * qw]);
      for (int64_t h = 0; h < s.Hq; ++h) std::copy_n(&l[(b * s.Hq + h) * len], len, &lse[(b * s.Hq + h) * s.T + t0]);
    }
  }
  EXPECT_TRUE(fd::close(out, full.out, 1e-2));
  EXPECT_TRUE(fd::close(lse, full.lse, 1e-6));
}

// The tensor API computes exactly what the float template computes: forward and backward in a fused
// QKV tensor with padding (dqkv starts as NaN, so the padding must stay NaN in both), and the KV
// cache's forward: q in its own tensor, k / v in caches with room for more tokens, at pos_offset.
TEST(Attention, TensorApiEqualsTheFloatTemplate) {
  const ExecContext cpu_ctx;
  const AttnShape s = kLongGqa;
  const auto qkv = fd::random_vector<float>(s.qkv_size(), 8, -2.0, 2.0);
  const auto dout = fd::random_vector<float>(s.out_size(), 9);
  std::vector<float> out_ref(s.out_size()), lse_ref(s.lse_size());
  std::vector<float> dqkv_ref(qkv.size(), std::numeric_limits<float>::quiet_NaN());
  forward(out_ref, lse_ref, qkv, s);
  float* dq = dqkv_ref.data();
  const float* q = qkv.data();
  cpu::attention_backward(dq, dq + s.k_offset(), dq + s.v_offset(), dout.data(), out_ref.data(), lse_ref.data(), q,
                          q + s.k_offset(), q + s.v_offset(), s.B, s.T, s.Hq, s.Hkv, s.dims(), s.fused(), s.fused(),
                          s.scale());

  const Tensor QKV = tensor_of(qkv, {s.B * s.T, s.stride()}, "qkv"),
               DOUT = tensor_of(dout, {s.B * s.T, s.Hq * s.D}, "dout");
  Tensor OUT = zeros({s.B * s.T, s.Hq * s.D}, "out"), LSE = zeros({s.B, s.Hq, s.T}, "lse");
  Tensor DQKV = tensor_of(std::vector<float>(qkv.size(), std::numeric_limits<float>::quiet_NaN()),
                          {s.B * s.T, s.stride()}, "dqkv");
  forward_tensor(cpu_ctx, OUT, LSE, QKV, s);
  backward_tensor(cpu_ctx, DQKV, DOUT, OUT, LSE, QKV, s);
  EXPECT_TRUE(fd::same_bits(values(OUT), out_ref));
  EXPECT_TRUE(fd::same_bits(values(LSE), lse_ref));
  EXPECT_TRUE(fd::same_bits(values(DQKV), dqkv_ref));

  // Decoding: 5 new tokens at position 40 of a cache of 64.
  const int64_t len = 5, pos = 40, cap = 64, qw = s.Hq * s.D, kw = s.Hkv * s.D;
  const auto qn = fd::random_vector<float>(s.B * len * qw, 10, -2.0, 2.0);
  const auto kc = fd::random_vector<float>(s.B * cap * kw, 11, -2.0, 2.0);
  const auto vc = fd::random_vector<float>(s.B * cap * kw, 12, -2.0, 2.0);
  const HeadStrides q_at{qw, s.q_per_group() * s.D}, kv_at{kw, s.D};
  std::vector<float> cout_ref(s.B * len * qw), clse_ref(s.B * s.Hq * len);
  cpu::attention_forward(cout_ref.data(), clse_ref.data(), qn.data(), kc.data(), vc.data(), s.B, len, s.Hq, s.Hkv, s.D,
                         q_at, kv_at, s.scale(), pos, cap * kw);
  Tensor COUT = zeros({s.B * len, qw}, "out"), CLSE = zeros({s.B, s.Hq, len}, "lse");
  attention_forward(cpu_ctx, COUT, CLSE, tensor_of(qn, {s.B * len, qw}, "q"), tensor_of(kc, {s.B, cap, kw}, "k_cache"),
                    tensor_of(vc, {s.B, cap, kw}, "v_cache"), s.B, len, s.Hq, s.Hkv, s.D, q_at, kv_at, s.scale(), pos,
                    cap * kw);
  EXPECT_TRUE(fd::same_bits(values(COUT), cout_ref));
  EXPECT_TRUE(fd::same_bits(values(CLSE), clse_ref));
}

// Errors name the op and the tensor: a dtype mismatch, a dtype the cpu lacks, a tensor on another
// device, a fused tensor one element short (without padding the last v head ends the buffer, so
// exactly B*T*stride elements fit), a KV cache too short for pos_offset + T or for its batch
// stride, out / lse of the wrong shape, Hq not a multiple of Hkv, an overflowing stride, an
// undefined tensor; the same for the backward's gradients.
TEST(Attention, TensorApiRejectsBadTensors) {
  const ExecContext cpu_ctx, gpu{Device::cuda(0), nullptr};
  const AttnShape s{.B = 2, .T = 5, .Hq = 4, .Hkv = 2, .D = 8};
  const int64_t N = s.B * s.T, qw = s.Hq * s.D, kw = s.Hkv * s.D, n = static_cast<int64_t>(s.qkv_size());
  const Tensor qkv = zeros({N, s.stride()}, "qkv"), out = zeros({N, qw}, "out"), lse = zeros({s.B, s.Hq, s.T}, "lse");
  const Tensor dqkv = zeros({N, s.stride()}, "dqkv"), dout = zeros({N, qw}, "dout");
  EXPECT_NO_THROW(forward_tensor(cpu_ctx, out, lse, qkv, s));
  EXPECT_NO_THROW(backward_tensor(cpu_ctx, dqkv, dout, out, lse, qkv, s));
  EXPECT_NO_THROW(forward_tensor(cpu_ctx, out, lse, zeros({n}, "exact_qkv"), s));

  const char* fwd = "kernel attention_forward";
  EXPECT_ERROR_CONTAINS(forward_tensor(cpu_ctx, out, zeros({s.B, s.Hq, s.T}, "lse64", DType::F64), qkv, s), fwd,
                        "'lse64' holds f64, expected f32");
  EXPECT_ERROR_CONTAINS(
      forward_tensor(cpu_ctx, zeros({N, qw}, "out_f16", DType::F16), zeros({s.B, s.Hq, s.T}, "lse_f32", DType::F32),
                     zeros({N, s.stride()}, "qkv_f16", DType::F16), s),
      "kernel attention_forward on cpu does not support dtype f16");
  EXPECT_ERROR_CONTAINS(forward_tensor(gpu, out, lse, qkv, s), fwd, "tensor 'out' is on cpu, the call runs on cuda:0");
  EXPECT_ERROR_CONTAINS(forward_tensor(cpu_ctx, out, lse, zeros({n - 1}, "short_qkv"), s), fwd,
                        "tensor 'short_qkv' has " + std::to_string(n - 1) + " elements", "need " + std::to_string(n));
  EXPECT_ERROR_CONTAINS(forward_tensor(cpu_ctx, zeros({N, qw + 1}, "wide_out"), lse, qkv, s), fwd,
                        "'wide_out' has shape");
  EXPECT_ERROR_CONTAINS(forward_tensor(cpu_ctx, out, zeros({s.B, s.Hq, s.T - 1}, "short_lse"), qkv, s), fwd,
                        "'short_lse' has shape");
  AttnShape odd = s;
  odd.Hq = 3;
  EXPECT_ERROR_CONTAINS(forward_tensor(cpu_ctx, zeros({N, 3 * s.D}, "out3"), zeros({s.B, 3, s.T}, "lse3"), qkv, odd),
                        fwd, "Hq must be a positive multiple of Hkv");
  EXPECT_ERROR_CONTAINS(
      attention_forward(cpu_ctx, out, lse, qkv, {qkv, s.k_offset()}, {qkv, s.v_offset()}, s.B, s.T, s.Hq, s.Hkv, s.D,
                        {std::numeric_limits<int64_t>::max() / 4, s.group_stride()}, s.fused(), s.scale()),
      fwd, "strides given for tensor 'qkv' overflow int64");
  EXPECT_ERROR_CONTAINS(forward_tensor(cpu_ctx, out, lse, Tensor(), s), fwd, "undefined");

  // The KV cache path: q [N, qw], caches [B, cap, kw]; 3 tokens at position 5 need 8 rows per batch row.
  const int64_t cap = 8, len = 3, pos = cap - len;
  const Tensor q = zeros({s.B * len, qw}, "q"), k = zeros({s.B, cap, kw}, "k_cache"),
               v = zeros({s.B, cap, kw}, "v_cache");
  const Tensor cout = zeros({s.B * len, qw}, "out"), clse = zeros({s.B, s.Hq, len}, "lse");
  const HeadStrides q_at{qw, s.q_per_group() * s.D}, kv_at{kw, s.D};
  const auto cached = [&](const Tensor& kc, int64_t p, int64_t batch_stride) {
    attention_forward(cpu_ctx, cout, clse, q, kc, v, s.B, len, s.Hq, s.Hkv, s.D, q_at, kv_at, s.scale(), p,
                      batch_stride);
  };
  EXPECT_NO_THROW(cached(k, pos, cap * kw));
  EXPECT_ERROR_CONTAINS(cached(k, pos + 1, cap * kw), fwd, "'k_cache' has");
  EXPECT_ERROR_CONTAINS(cached(k, pos, (cap + 1) * kw), fwd, "'k_cache' has");
  EXPECT_ERROR_CONTAINS(cached(zeros({s.B, cap - 1, kw}, "short_k_cache"), pos - 1, cap * kw), fwd,
                        "'short_k_cache' has");
  EXPECT_ERROR_CONTAINS(cached(k, -1, cap * kw), fwd, "invalid sizes");

  const char* bwd = "kernel attention_backward";
  EXPECT_ERROR_CONTAINS(backward_tensor(cpu_ctx, zeros({N, s.stride()}, "dqkv64", DType::F64), dout, out, lse, qkv, s),
                        bwd, "'dqkv64' holds f64, expected f32");
  EXPECT_ERROR_CONTAINS(backward_tensor(cpu_ctx, zeros({n - 1}, "short_dqkv"), dout, out, lse, qkv, s), bwd,
                        "tensor 'short_dqkv' has");
  EXPECT_ERROR_CONTAINS(backward_tensor(cpu_ctx, dqkv, dout, out, lse, zeros({n - 1}, "short_qkv"), s), bwd,
                        "tensor 'short_qkv' has");
  EXPECT_ERROR_CONTAINS(backward_tensor(cpu_ctx, dqkv, zeros({N, qw - 1}, "narrow_dout"), out, lse, qkv, s), bwd,
                        "'narrow_dout' has shape");
  EXPECT_ERROR_CONTAINS(backward_tensor(gpu, dqkv, dout, out, lse, qkv, s), bwd, "tensor 'dqkv' is on cpu");
}

// On a CUDA device training attention runs f32 with heads up to 256 wide (backend_test checks its
// values) and decoding has no kernel yet: each refusal names the op.
TEST(Attention, TensorApiOnCudaRefusesWhatItLacks) {
#ifdef MEGATON_WITH_CUDA
  if (megaton::cuda::device_count() == 0) GTEST_SKIP() << "skipped: no CUDA device";
  const ExecContext gpu{Device::cuda(0), nullptr};
  const auto on_gpu = [](Shape shape, const std::string& name, DType dtype) {
    Tensor t = zeros(std::move(shape), name).to(dtype).to(Device::cuda(0));
    t.set_name(name);
    return t;
  };
  const AttnShape s{.B = 1, .T = 3, .Hq = 2, .Hkv = 1, .D = 8};
  const Tensor qkv = on_gpu({s.T, s.stride()}, "qkv", DType::F32);
  EXPECT_ERROR_CONTAINS(decode_attention(gpu, on_gpu({1, s.Hq * s.D}, "decode_out", DType::F32), {qkv, 0},
                                         {qkv, s.k_offset()}, {qkv, s.v_offset()}, 1, 1, s.Hq, s.Hkv, s.D, s.fused(),
                                         s.fused(), s.scale(), s.T, s.T * s.stride()),
                        "kernel decode_attention has no implementation for cuda:0");
  // bf16 runs the flash kernels (flash_attention_cuda_test): lse in f32, the instantiated head sizes.
  EXPECT_ERROR_CONTAINS(forward_tensor(gpu, on_gpu({s.T, s.Hq * s.D}, "out16", DType::BF16),
                                       on_gpu({1, s.Hq, s.T}, "lse16", DType::BF16),
                                       on_gpu({s.T, s.stride()}, "qkv16", DType::BF16), s),
                        "kernel attention_forward: tensor 'lse16' holds bf16, expected f32");
  EXPECT_ERROR_CONTAINS(forward_tensor(gpu, on_gpu({s.T, s.Hq * s.D}, "out16", DType::BF16),
                                       on_gpu({1, s.Hq, s.T}, "lse32", DType::F32),
                                       on_gpu({s.T, s.stride()}, "qkv16", DType::BF16), s),
                        "kernel attention_forward on cuda: flash attention has kernels for head dims 32, 64, 128, 192 "
                        "and 192 (qk) / 128 (v), not 8 / 8");
  const AttnShape wide{.B = 1, .T = 3, .Hq = 2, .Hkv = 1, .D = 264};
  EXPECT_ERROR_CONTAINS(forward_tensor(gpu, on_gpu({wide.T, wide.Hq * wide.D}, "wide_out", DType::F32),
                                       on_gpu({1, wide.Hq, wide.T}, "wide_lse", DType::F32),
                                       on_gpu({wide.T, wide.stride()}, "wide_qkv", DType::F32), wide),
                        "head dims 264 / 264 exceed 256");
#else
  GTEST_SKIP() << "skipped: built without CUDA";
#endif
}
