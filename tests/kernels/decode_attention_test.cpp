// Decode attention (one query token per sequence over a KV cache, or a few: speculative
// verification) against the existing flash-style attention_forward on the same cache (Tlen Tq,
// pos_offset Tk - Tq), MHA and GQA, in float and double.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "../support/host_tensors.h"
#include "finite_diff.h"
#include "megaton/kernels/attention.h"

using namespace megaton;
using namespace megaton::kernels;

namespace {

// The layouts of nn/attention.cpp's decode step: the Tq new tokens' fused QKV rows (per kv group
// [R q heads | k | v]) and caches [B, capacity, Hkv * D] holding Tk tokens (the new ones included).
struct DecodeShape {
  int64_t B, Hq, Hkv, D, Tk, capacity, Tq = 1;
  int64_t R() const { return Hq / Hkv; }
  int64_t group() const { return (R() + 2) * D; }
  int64_t qkv_row() const { return Hkv * group(); }
  int64_t kv_row() const { return Hkv * D; }
};

struct Inputs {
  Tensor qkv, k, v;
};

Inputs random_inputs(const DecodeShape& s, DType dtype, uint64_t seed) {
  Inputs in{Tensor::empty({s.B * s.Tq, s.qkv_row()}, dtype), Tensor::empty({s.B, s.capacity, s.kv_row()}, dtype),
            Tensor::empty({s.B, s.capacity, s.kv_row()}, dtype)};
  uint64_t i = 0;
  for (Tensor* t : {&in.qkv, &in.k, &in.v}) {
    // Scores of a few units, so the softmax is neither flat nor one-hot.
    const auto r = fd::random_vector<double>(static_cast<size_t>(t->numel()), seed + i++, -2.0, 2.0);
    for (int64_t e = 0; e < t->numel(); ++e) {
      if (dtype == DType::F32)
        t->data<float>()[e] = static_cast<float>(r[e]);
      else
        t->data<double>()[e] = r[e];
    }
  }
  return in;
}

Tensor decode(const DecodeShape& s, const Inputs& in, DType dtype) {
  Tensor out = Tensor::zeros({s.B * s.Tq, s.Hq * s.D}, dtype);
  decode_attention(ExecContext::on(out), out, {in.qkv, 0}, in.k, in.v, s.B, s.Tq, s.Hq, s.Hkv, s.D,
                   {s.qkv_row(), s.group()}, {s.kv_row(), s.D}, 1.0 / std::sqrt(double(s.D)), s.Tk,
                   s.capacity * s.kv_row());
  return out;
}

Tensor flash(const DecodeShape& s, const Inputs& in, DType dtype) {
  Tensor out = Tensor::zeros({s.B * s.Tq, s.Hq * s.D}, dtype), lse = Tensor::zeros({s.B * s.Hq, s.Tq}, dtype);
  attention_forward(ExecContext::on(out), out, lse, {in.qkv, 0}, in.k, in.v, s.B, s.Tq, s.Hq, s.Hkv, s.D,
                    {s.qkv_row(), s.group()}, {s.kv_row(), s.D}, 1.0 / std::sqrt(double(s.D)), s.Tk - s.Tq,
                    s.capacity * s.kv_row());
  return out;
}

double at(const Tensor& t, int64_t e) {
  return t.dtype() == DType::F32 ? double(t.data<float>()[e]) : t.data<double>()[e];
}

// One key, a partial block, several blocks; MHA, GQA and one kv group; D below and above a vector;
// one new token, or several (a verification step: its queries straddle a block edge).
const std::vector<DecodeShape> kShapes = {
    {1, 4, 4, 8, 1, 3},        {2, 6, 2, 24, 65, 70},    {1, 8, 1, 64, 130, 130},    {3, 4, 2, 5, 64, 100},
    {1, 12, 12, 64, 200, 256}, {2, 6, 2, 24, 67, 70, 5}, {1, 8, 1, 64, 130, 130, 8}, {3, 4, 2, 5, 3, 9, 3}};

}  // namespace

TEST(DecodeAttention, MatchesTheFlashAttentionPathOverTheCache) {
  for (DType dtype : {DType::F32, DType::F64}) {
    const double tol = dtype == DType::F32 ? 2e-6 : 1e-13;
    for (const DecodeShape& s : kShapes) {
      const Inputs in = random_inputs(s, dtype, 11);
      const Tensor got = decode(s, in, dtype), want = flash(s, in, dtype);
      for (int64_t e = 0; e < got.numel(); ++e) {
        ASSERT_TRUE(std::isfinite(at(got, e))) << "Hq " << s.Hq << " Tk " << s.Tk << " element " << e;
        ASSERT_NEAR(at(got, e), at(want, e), tol) << "Hq " << s.Hq << " Tk " << s.Tk << " element " << e;
      }
    }
  }
}

// Query t of a Tq-token call has the bits of a one-token call over the first Tk - (Tq - 1 - t)
// tokens: a verification step reproduces the decode steps it stands for (planted: every query over
// all Tk tokens, caught; the causal offset off by one, caught).
TEST(DecodeAttention, EachOfSeveralQueriesHasTheBitsOfAOneTokenCall) {
  const DecodeShape s{2, 6, 2, 24, 69, 72, 6};
  const Inputs in = random_inputs(s, DType::F32, 14);
  const Tensor all = decode(s, in, DType::F32);
  Tensor one = Tensor::zeros({1, s.Hq * s.D}, DType::F32);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t t = 0; t < s.Tq; ++t) {
      const int64_t row = b * s.Tq + t;
      decode_attention(ExecContext::on(one), one, {in.qkv, row * s.qkv_row()}, {in.k, b * s.capacity * s.kv_row()},
                       {in.v, b * s.capacity * s.kv_row()}, 1, 1, s.Hq, s.Hkv, s.D, {s.qkv_row(), s.group()},
                       {s.kv_row(), s.D}, 1.0 / std::sqrt(double(s.D)), s.Tk - (s.Tq - 1 - t), 0);
      for (int64_t e = 0; e < s.Hq * s.D; ++e)
        ASSERT_EQ(one.data<float>()[e], all.data<float>()[row * s.Hq * s.D + e]) << "row " << b << " query " << t;
    }
}

// A bf16 cache (a bf16 model's, nn/attention.cpp): f32 math on the widened elements, so the f32
// kernel over the same rounded values gives the same result, to the order the vectorised dot
// products sum in; k and v must share a dtype. Planted: values widened from the keys, caught.
TEST(DecodeAttention, ABf16CacheIsTheF32KernelOverItsRoundedValues) {
  for (const DecodeShape& s : kShapes) {
    Inputs in = random_inputs(s, DType::F32, 17);
    const Inputs bf16{in.qkv, in.k.to(DType::BF16), in.v.to(DType::BF16)};
    const Inputs rounded{in.qkv, bf16.k.to(DType::F32), bf16.v.to(DType::F32)};
    const Tensor got = decode(s, bf16, DType::F32), want = decode(s, rounded, DType::F32);
    for (int64_t e = 0; e < got.numel(); ++e) {
      ASSERT_TRUE(std::isfinite(at(got, e)));
      ASSERT_NEAR(at(got, e), at(want, e), 1e-6) << "Hq " << s.Hq << " Tk " << s.Tk << " element " << e;
    }
    EXPECT_THROW(decode(s, {in.qkv, bf16.k, in.v}, DType::F32), Error);
  }
}

// A NaN in one cached key reaches the query heads of its group only.
TEST(DecodeAttention, NaNInAKeyReachesItsGroupOnly) {
  const DecodeShape s{1, 6, 3, 16, 90, 96};
  Inputs in = random_inputs(s, DType::F32, 12);
  in.k.data<float>()[77 * s.kv_row() + 1 * s.D + 3] = std::numeric_limits<float>::quiet_NaN();  // token 77, group 1
  const Tensor got = decode(s, in, DType::F32);
  for (int64_t h = 0; h < s.Hq; ++h)
    for (int64_t d = 0; d < s.D; ++d)
      EXPECT_EQ(std::isnan(got.data<float>()[h * s.D + d]), h / s.R() == 1) << "head " << h;
}

TEST(DecodeAttention, RejectsCachesTooSmallAndHeadsThatDoNotGroup) {
  const DecodeShape s{1, 4, 2, 8, 10, 10};
  const Inputs in = random_inputs(s, DType::F32, 13);
  Tensor out = Tensor::zeros({1, 32}, DType::F32);
  const auto call = [&](int64_t Hkv, int64_t Tk) {
    decode_attention(ExecContext::on(out), out, {in.qkv, 0}, in.k, in.v, 1, 1, 4, Hkv, 8, {s.qkv_row(), s.group()},
                     {s.kv_row(), 8}, 0.3, Tk, s.capacity * s.kv_row());
  };
  EXPECT_NO_THROW(call(2, 10));
  EXPECT_THROW(call(2, 11), Error);  // one token more than the cache holds
  EXPECT_THROW(call(2, 0), Error);
  EXPECT_THROW(call(3, 10), Error);  // 4 query heads in 3 groups
  Tensor two = Tensor::zeros({2, 32}, DType::F32);
  EXPECT_THROW(decode_attention(ExecContext::on(two), two, {in.qkv, 0}, in.k, in.v, 1, 2, 4, 2, 8,
                                {s.qkv_row(), s.group()}, {s.kv_row(), 8}, 0.3, 1, s.capacity * s.kv_row()),
               Error);  // two new tokens, one cached
}

// MLA's absorbed decoding: one kv head of keys [c | k_rope] (R + r wide) whose values are the keys'
// first R columns (HeadDim{R + r, R}, v the same tensor as k), all query heads in one group; the
// contiguous and the paged cache (pages shuffled, a partial last page) against attention_forward.
TEST(DecodeAttention, LatentKeysWithValuesInTheirFirstColumnsMatchTheFlashPath) {
  const int64_t B = 2, H = 5, R = 24, r = 8, W = R + r, Tk = 70, P = 16, pages_per_row = 5;
  const HeadDim D{W, R};
  const HeadStrides q_at{H * W, H * W}, kv_at{W, W};
  const auto uniform = [](Shape shape, uint64_t seed, double range) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return megaton::testing::tensor_of(fd::random_vector<float>(static_cast<size_t>(n), seed, -range, range), shape,
                                       "x");
  };
  const auto doubles = [](const Tensor& t) {
    const std::vector<float> v = megaton::testing::values(t);
    return std::vector<double>(v.begin(), v.end());
  };
  const Tensor q = uniform({B, H * W}, 21, 1.0);
  const Tensor cache = uniform({B, Tk, W}, 22, 2.0);
  Tensor want = Tensor::zeros({B, H * R}, DType::F32), lse = Tensor::zeros({B * H, 1}, DType::F32);
  attention_forward(ExecContext::on(q), want, lse, q, cache, cache, B, 1, H, 1, D, q_at, kv_at, 0.2, Tk - 1);
  Tensor got = Tensor::zeros({B, H * R}, DType::F32);
  decode_attention(ExecContext::on(q), got, q, cache, cache, B, 1, H, 1, D, q_at, kv_at, 0.2, Tk, Tk * W);
  EXPECT_TRUE(fd::close(doubles(got), doubles(want), 2e-6)) << "contiguous";
  // The same tokens in pages, shuffled: row b's page i is pool page 5 b + 3 i mod 5.
  Tensor pool = Tensor::zeros({10, P, W}, DType::F32), table = Tensor::zeros({B, pages_per_row}, DType::I32);
  Tensor lens = Tensor::empty({B}, DType::I64);
  for (int64_t b = 0; b < B; ++b) {
    lens.data<int64_t>()[b] = Tk;
    for (int64_t i = 0; i < pages_per_row; ++i) {
      const int32_t page = static_cast<int32_t>(5 * b + 3 * i % 5);
      table.data<int32_t>()[b * pages_per_row + i] = page;
      for (int64_t t = i * P; t < std::min(Tk, (i + 1) * P); ++t)
        std::copy_n(cache.data<float>() + (b * Tk + t) * W, W, pool.data<float>() + (page * P + t % P) * W);
    }
  }
  Tensor paged = Tensor::zeros({B, H * R}, DType::F32);
  paged_decode_attention(ExecContext::on(q), paged, q, pool, pool, table, lens, B, 1, H, 1, D, q_at, kv_at, 0.2);
  EXPECT_TRUE(fd::close(doubles(paged), doubles(want), 2e-6)) << "paged";
}
