// The CUDA flash attention (bf16 / fp16, kernels/flash_attention_plan.h) against the CPU attention
// in double precision on the same dtype-rounded inputs: every instantiated head size (32, 64, 128,
// 192, MLA's 192 / 128), GQA inside Megatron's fused QKV rows with the gradients landing in a fused
// dQKV, sequence lengths that are not multiples of the 64-row tiles, a KV cache (pos_offset, room for
// more tokens per row). Outputs start as NaN. The backward is deterministic (no atomics): two runs
// agree bit for bit. What the kernels do not take is refused with a message naming it. Without a
// CUDA device every case reports "skipped: no CUDA device".
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <limits>

#include "finite_diff.h"
#include "megaton/kernels/attention.h"
#include "megaton/kernels/cpu/attention.h"
#ifdef MEGATON_WITH_CUDA
#include "megaton/core/cuda/cuda_memory.h"
#endif

namespace megaton::kernels {
namespace {

class FlashAttentionCuda : public ::testing::TestWithParam<DType> {
 public:  // check_fused, a free function, drives the helpers below
  void SetUp() override {
#ifdef MEGATON_WITH_CUDA
    if (cuda::device_count() == 0) GTEST_SKIP() << "skipped: no CUDA device";
#else
    GTEST_SKIP() << "skipped: built without CUDA";
#endif
  }
  static constexpr Device gpu() { return Device::cuda(0); }
  static ExecContext ctx() { return {gpu(), nullptr}; }
  DType dt() const { return GetParam(); }
  // The errors of a bf16 / fp16 attention against the double reference, relative to the largest
  // reference value: the output and the probabilities are rounded to 8 (bf16) or 11 (fp16)
  // significant bits before each product; the fp32 accumulation adds little.
  double tolerance() const { return dt() == DType::BF16 ? 2e-2 : 4e-3; }

  // Values rounded to the dtype, as doubles, so the reference sees what the kernel sees.
  std::vector<double> rounded(std::vector<double> v) const {
    Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::F64);
    std::copy(v.begin(), v.end(), t.data<double>());
    Tensor back = t.to(dt()).to(DType::F64);
    return {back.data<double>(), back.data<double>() + back.numel()};
  }
  Tensor up(const std::vector<double>& v, Shape shape, const std::string& name, DType dtype) const {
    Tensor host = Tensor::empty(std::move(shape), DType::F64, MemCategory::Other, name);
    std::copy(v.begin(), v.end(), host.data<double>());
    Tensor t = host.to(dtype).to(gpu());
    t.set_name(name);
    return t;
  }
  Tensor up(const std::vector<double>& v, Shape shape, const std::string& name) const {
    return up(v, std::move(shape), name, dt());
  }
  Tensor poisoned(Shape shape, const std::string& name, DType dtype) const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return up(std::vector<double>(static_cast<size_t>(n), std::numeric_limits<double>::quiet_NaN()), std::move(shape),
              name, dtype);
  }
  static std::vector<double> down(const Tensor& t) {
    Tensor host = t.to(Device::cpu()).to(DType::F64);
    return {host.data<double>(), host.data<double>() + host.numel()};
  }
};

// One training attention in fused QKV rows (Megatron's layout: per group, its q heads then k then v),
// forward and backward, against the double reference; returns the backward's dQKV for the
// determinism check.
struct FusedCase {
  int64_t B, Tlen, Hq, Hkv;
  HeadDim D;
  double scale;
};

std::vector<double> check_fused(const FlashAttentionCuda& t, const FusedCase& c, uint64_t seed) {
  const int64_t group = c.Hq / c.Hkv, block = group * c.D.qk + c.D.qk + c.D.v, row = c.Hkv * block;
  const HeadStrides at{row, block};
  const int64_t k_off = group * c.D.qk, v_off = k_off + c.D.qk;
  const auto qkv = t.rounded(fd::random_vector(c.B * c.Tlen * row, seed, -2.0, 2.0));
  const auto dy = t.rounded(fd::random_vector(c.B * c.Tlen * c.Hq * c.D.v, seed + 1));
  std::vector<double> out_ref(c.B * c.Tlen * c.Hq * c.D.v), lse_ref(c.B * c.Hq * c.Tlen), dqkv_ref(qkv.size());
  cpu::attention_forward(out_ref.data(), lse_ref.data(), qkv.data(), qkv.data() + k_off, qkv.data() + v_off, c.B,
                         c.Tlen, c.Hq, c.Hkv, c.D, at, at, c.scale);
  // The reference backward takes the kernel's rounded output, as the GPU backward does.
  const auto out_rounded = t.rounded(out_ref);
  cpu::attention_backward(dqkv_ref.data(), dqkv_ref.data() + k_off, dqkv_ref.data() + v_off, dy.data(),
                          out_rounded.data(), lse_ref.data(), qkv.data(), qkv.data() + k_off, qkv.data() + v_off, c.B,
                          c.Tlen, c.Hq, c.Hkv, c.D, at, at, c.scale);
  const Tensor QKV = t.up(qkv, {c.B * c.Tlen, row}, "qkv"), DY = t.up(dy, {c.B * c.Tlen, c.Hq * c.D.v}, "dy");
  const Tensor OUT = t.poisoned({c.B * c.Tlen, c.Hq * c.D.v}, "out", t.dt());
  const Tensor LSE = t.poisoned({c.B * c.Hq, c.Tlen}, "lse", DType::F32);
  const Tensor DQKV = t.poisoned({c.B * c.Tlen, row}, "dqkv", t.dt());
  attention_forward(t.ctx(), OUT, LSE, {QKV, 0}, {QKV, k_off}, {QKV, v_off}, c.B, c.Tlen, c.Hq, c.Hkv, c.D, at, at,
                    c.scale);
  attention_backward(t.ctx(), {DQKV, 0}, {DQKV, k_off}, {DQKV, v_off}, DY, OUT, LSE, {QKV, 0}, {QKV, k_off},
                     {QKV, v_off}, c.B, c.Tlen, c.Hq, c.Hkv, c.D, at, at, c.scale);
  const std::string what = "D " + std::to_string(c.D.qk) + "/" + std::to_string(c.D.v) + ", Tlen " +
                           std::to_string(c.Tlen) + ", Hq " + std::to_string(c.Hq) + "/" + std::to_string(c.Hkv);
  EXPECT_TRUE(fd::close(t.down(OUT), out_ref, t.tolerance())) << "forward, " << what;
  EXPECT_TRUE(fd::close(t.down(LSE), lse_ref, 1e-5)) << "lse, " << what;
  const auto dqkv = t.down(DQKV);
  EXPECT_TRUE(fd::close(dqkv, dqkv_ref, t.tolerance())) << "dq, dk, dv, " << what;
  return dqkv;
}

TEST_P(FlashAttentionCuda, EveryHeadSizeMatchesTheDoubleReferenceWithGqaInFusedQkvRows) {
  check_fused(*this, {2, 77, 4, 2, 64, 0.125}, 10);
  check_fused(*this, {2, 130, 4, 2, 128, 0.088}, 20);
  check_fused(*this, {1, 70, 6, 6, 32, 0.18}, 30);
  check_fused(*this, {1, 65, 2, 1, 192, 0.072}, 40);
  check_fused(*this, {1, 93, 3, 3, {192, 128}, 0.072}, 50);  // DeepSeek-V3's MLA: qk 128 + 64, v 128
}

TEST_P(FlashAttentionCuda, BackwardIsDeterministic) {
  const FusedCase c{2, 150, 8, 2, 64, 0.125};
  EXPECT_EQ(check_fused(*this, c, 60), check_fused(*this, c, 60));
}

TEST_P(FlashAttentionCuda, ForwardOverAKvCacheMatchesTheReference) {
  // 37 cached tokens, 30 new ones, room for 80 per batch row; q, k and v in separate [.., H, D] buffers.
  const int64_t B = 2, Tlen = 30, Hq = 6, Hkv = 2, D = 64, pos = 37, cap = 80;
  const HeadStrides q_at{Hq * D, (Hq / Hkv) * D}, kv_at{Hkv * D, D};
  const auto q = rounded(fd::random_vector(B * Tlen * Hq * D, 70));
  const auto k = rounded(fd::random_vector(B * cap * Hkv * D, 71)), v = rounded(fd::random_vector(B * cap * Hkv * D, 72));
  std::vector<double> out_ref(B * Tlen * Hq * D), lse_ref(B * Hq * Tlen);
  cpu::attention_forward(out_ref.data(), lse_ref.data(), q.data(), k.data(), v.data(), B, Tlen, Hq, Hkv, D, q_at,
                         kv_at, 0.125, pos, cap * kv_at.row);
  const Tensor Q = up(q, {B * Tlen, Hq * D}, "q"), K = up(k, {B * cap, Hkv * D}, "k"), V = up(v, {B * cap, Hkv * D}, "v");
  const Tensor OUT = poisoned({B * Tlen, Hq * D}, "out", dt()), LSE = poisoned({B * Hq, Tlen}, "lse", DType::F32);
  attention_forward(ctx(), OUT, LSE, Q, K, V, B, Tlen, Hq, Hkv, D, q_at, kv_at, 0.125, pos, cap * kv_at.row);
  EXPECT_TRUE(fd::close(down(OUT), out_ref, tolerance())) << "forward with a KV cache";
  EXPECT_TRUE(fd::close(down(LSE), lse_ref, 1e-5)) << "lse with a KV cache";
}

TEST_P(FlashAttentionCuda, RefusesWhatItLacksWithAClearError) {
  const auto expect_error = [](auto&& f, const std::string& words) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one saying '" << words << "'";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  const int64_t B = 1, Tlen = 8, H = 2;
  const auto run = [&](int64_t D, int64_t q_offset, DType lse_dtype) {
    const Tensor QKV = up(rounded(fd::random_vector(B * Tlen * 3 * H * D + 8, 80)), {B * Tlen * 3 * H * D + 8}, "qkv");
    const Tensor OUT = poisoned({B * Tlen, H * D}, "out", dt()), LSE = poisoned({B * H, Tlen}, "lse", lse_dtype);
    const HeadStrides at{3 * H * D, 3 * D};
    attention_forward(ctx(), OUT, LSE, {QKV, q_offset}, {QKV, q_offset + D}, {QKV, q_offset + 2 * D}, B, Tlen, H, H,
                      D, at, at, 0.1);
  };
  expect_error([&] { run(96, 0, DType::F32); }, "head dims 32, 64, 128, 192");
  expect_error([&] { run(64, 4, DType::F32); }, "multiple of 8 elements");
  expect_error([&] { run(64, 0, dt()); }, "lse");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FlashAttentionCuda, ::testing::Values(DType::BF16, DType::F16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace megaton::kernels
