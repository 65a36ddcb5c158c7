#include "megaton/kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "finite_diff.h"

using namespace megaton;
using namespace megaton::kernels;

namespace {

// q, k and v of each token in one fused buffer in Megatron's per-query-group layout, as a fused QKV
// projection produces them: per kv group a block of [Hq / Hkv q heads | k head | v head] (+ pad).
// pad > 0 leaves unused columns after each group's heads, so the group stride is not implied by D.
struct Shape {
  int64_t B, T, Hq, Hkv, D, pad = 0;
  int64_t q_per_group() const { return Hq / Hkv; }
  int64_t group_stride() const { return (q_per_group() + 2) * D + pad; }
  int64_t stride() const { return Hkv * group_stride(); }
  HeadStrides fused() const { return {stride(), group_stride()}; }
  // Where query head h, and the k / v head of group g, start in a token's row.
  int64_t q_at(int64_t h) const { return h / q_per_group() * group_stride() + h % q_per_group() * D; }
  int64_t k_at(int64_t g) const { return g * group_stride() + k_offset(); }
  int64_t v_at(int64_t g) const { return g * group_stride() + v_offset(); }
  int64_t k_offset() const { return q_per_group() * D; }
  int64_t v_offset() const { return (q_per_group() + 1) * D; }
  size_t qkv_size() const { return B * T * stride(); }
  size_t out_size() const { return B * T * Hq * D; }
  size_t lse_size() const { return B * Hq * T; }
  double scale() const { return 1.0 / std::sqrt(double(D)); }
  bool is_pad(size_t i) const { return int64_t(i % group_stride()) >= (q_per_group() + 2) * D; }
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
Result naive_attention(const std::vector<T>& qkv, const std::vector<T>& dout, const Shape& s) {
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
        const int64_t orow = ((b * s.T + t) * s.Hq + h) * s.D;
        std::vector<double> dp(t + 1);
        double di = 0;
        for (int64_t j = 0; j <= t; ++j) {
          for (int64_t d = 0; d < s.D; ++d) {
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
            r.dqkv[at(b, j, vo + d)] += p[j] * dout[orow + d];
          }
        }
      }
    }
  return r;
}

template <typename T>
void forward(std::vector<T>& out, std::vector<T>& lse, const std::vector<T>& qkv, const Shape& s) {
  const T* q = qkv.data();
  attention_forward(out.data(), lse.data(), q, q + s.k_offset(), q + s.v_offset(), s.B, s.T, s.Hq, s.Hkv, s.D,
                    s.fused(), s.fused(), s.scale());
}

// Kernel forward and backward; dqkv starts as NaN so that any element the backward should write but
// does not shows up.
template <typename T>
Result run_kernel(const std::vector<T>& qkv, const std::vector<T>& dout, const Shape& s) {
  std::vector<T> out(s.out_size()), lse(s.lse_size());
  std::vector<T> dqkv(qkv.size(), std::numeric_limits<T>::quiet_NaN());
  forward(out, lse, qkv, s);
  const T* q = qkv.data();
  T* dq = dqkv.data();
  attention_backward(dq, dq + s.k_offset(), dq + s.v_offset(), dout.data(), out.data(), lse.data(), q, q + s.k_offset(),
                     q + s.v_offset(), s.B, s.T, s.Hq, s.Hkv, s.D, s.fused(), s.fused(), s.scale());
  return {convert<double>(out), convert<double>(lse), convert<double>(dqkv)};
}

// The padding columns of dqkv must be untouched (still NaN); zero them so the rest can be compared.
void expect_pad_untouched_then_clear(std::vector<double>& dqkv, const Shape& s) {
  for (size_t i = 0; i < dqkv.size(); ++i) {
    if (!s.is_pad(i)) continue;
    ASSERT_TRUE(std::isnan(dqkv[i])) << "padding element " << i << " was written";
    dqkv[i] = 0;
  }
}

// Loss = sum(dout * out); the gradient w.r.t. the whole fused buffer, q, k and v at once. The ~10^4
// tiny forwards run on one thread, where OpenMP fork/join cannot dominate on a busy machine (thread
// independence is tested separately).
void check_gradients(const Shape& s) {
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

void check_against_naive(const Shape& s, double tol, bool single) {
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
const Shape kLongGqa{.B = 2, .T = 150, .Hq = 4, .Hkv = 2, .D = 64, .pad = 3};

}  // namespace

TEST(Attention, GqaGradientsMatchFiniteDifferences) { check_gradients({.B = 2, .T = 17, .Hq = 6, .Hkv = 2, .D = 24}); }

TEST(Attention, MhaGradientsMatchFiniteDifferences) { check_gradients({.B = 2, .T = 17, .Hq = 2, .Hkv = 2, .D = 24}); }

TEST(Attention, MatchesNaiveInDouble) { check_against_naive(kLongGqa, 1e-12, false); }

TEST(Attention, MatchesNaiveInFloat) { check_against_naive(kLongGqa, 5e-6, true); }

// Decoding with a KV cache: the first 70 tokens as one chunk, then one token at a time, each chunk's
// queries gathered into their own contiguous [len, Hq, D] buffer and k/v read from the full fused
// buffer at pos_offset.
TEST(Attention, PosOffsetChunksMatchFullCausalForward) {
  const Shape s = kLongGqa;
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
    attention_forward(chunk_out.data(), chunk_lse.data(), q.data(), k, qkv.data() + s.v_offset(), s.B, len, s.Hq, s.Hkv,
                      s.D, {qw, s.q_per_group() * s.D}, s.fused(), s.scale(), t0, s.T * s.stride());
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
