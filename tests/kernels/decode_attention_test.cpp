// Decode attention (one query token per sequence over a KV cache) against the existing flash-style
// attention_forward on the same cache (Tlen 1, pos_offset Tk - 1), MHA and GQA, in float and double.
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

// The layouts of nn/attention.cpp's decode step: the new token's fused QKV row (per kv group
// [R q heads | k | v]) and caches [B, capacity, Hkv * D] holding Tk tokens.
struct DecodeShape {
  int64_t B, Hq, Hkv, D, Tk, capacity;
  int64_t R() const { return Hq / Hkv; }
  int64_t group() const { return (R() + 2) * D; }
  int64_t qkv_row() const { return Hkv * group(); }
  int64_t kv_row() const { return Hkv * D; }
};

struct Inputs {
  Tensor qkv, k, v;
};

Inputs random_inputs(const DecodeShape& s, DType dtype, uint64_t seed) {
  Inputs in{Tensor::empty({s.B, s.qkv_row()}, dtype), Tensor::empty({s.B, s.capacity, s.kv_row()}, dtype),
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
  Tensor out = Tensor::zeros({s.B, s.Hq * s.D}, dtype);
  decode_attention(ExecContext::on(out), out, {in.qkv, 0}, in.k, in.v, s.B, s.Hq, s.Hkv, s.D,
                   {s.qkv_row(), s.group()}, {s.kv_row(), s.D}, 1.0 / std::sqrt(double(s.D)), s.Tk,
                   s.capacity * s.kv_row());
  return out;
}

Tensor flash(const DecodeShape& s, const Inputs& in, DType dtype) {
  Tensor out = Tensor::zeros({s.B, s.Hq * s.D}, dtype), lse = Tensor::zeros({s.B * s.Hq, 1}, dtype);
  attention_forward(ExecContext::on(out), out, lse, {in.qkv, 0}, in.k, in.v, s.B, 1, s.Hq, s.Hkv, s.D,
                    {s.qkv_row(), s.group()}, {s.kv_row(), s.D}, 1.0 / std::sqrt(double(s.D)), s.Tk - 1,
                    s.capacity * s.kv_row());
  return out;
}

double at(const Tensor& t, int64_t e) {
  return t.dtype() == DType::F32 ? double(t.data<float>()[e]) : t.data<double>()[e];
}

// One key, a partial block, several blocks; MHA, GQA and one kv group; D below and above a vector.
const std::vector<DecodeShape> kShapes = {{1, 4, 4, 8, 1, 3},     {2, 6, 2, 24, 65, 70},  {1, 8, 1, 64, 130, 130},
                                          {3, 4, 2, 5, 64, 100}, {1, 12, 12, 64, 200, 256}};

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
    decode_attention(ExecContext::on(out), out, {in.qkv, 0}, in.k, in.v, 1, 4, Hkv, 8, {s.qkv_row(), s.group()},
                     {s.kv_row(), 8}, 0.3, Tk, s.capacity * s.kv_row());
  };
  EXPECT_NO_THROW(call(2, 10));
  EXPECT_THROW(call(2, 11), Error);  // one token more than the cache holds
  EXPECT_THROW(call(2, 0), Error);
  EXPECT_THROW(call(3, 10), Error);  // 4 query heads in 3 groups
}
