// RoPE: the CPU templates (kernels::cpu, float and double) against an explicit complex rotation and
// finite differences, and the tensor API (kernels::rope_tables / rope_apply) against the float
// template, bit for bit, with its checks.
#include "megaton/kernels/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <limits>
#include <numbers>
#include <vector>

#include "../support/host_tensors.h"
#include "../support/temp_dir.h"
#include "finite_diff.h"
#include "megaton/kernels/cpu/rope.h"
#include "megaton/nn/linear.h"  // as_dtype
#ifdef MEGATON_WITH_CUDA
#include "megaton/core/cuda/cuda_memory.h"
#endif

using namespace megaton;
using namespace megaton::kernels;

namespace {

constexpr int64_t kB = 2, kT = 17, kH = 6, kHkv = 2, kD = 24;
// A fused QKV token in Megatron's per-query-group layout: per kv group, its kH / kHkv q heads, its
// k head and its v head.
constexpr int64_t kGroup = (kH / kHkv + 2) * kD;
constexpr int64_t kStride = kHkv * kGroup;
constexpr int64_t kOffset = 5;  // positions kOffset .. kOffset + kT - 1

// Pair (a, b) of head dimension i as the complex number a + ib, multiplied by exp(i pos inv_freq);
// rotates the head at `offset` in every fused token.
void rotate_reference(double* x, int64_t offset, const std::vector<double>& inv_freq, RopeLayout layout) {
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t t = 0; t < kT; ++t) {
      double* head = x + (b * kT + t) * kStride + offset;
      for (int64_t i = 0; i < kD / 2; ++i) {
        const int64_t i0 = layout == RopeLayout::Half ? i : 2 * i;
        const int64_t i1 = layout == RopeLayout::Half ? i + kD / 2 : 2 * i + 1;
        const std::complex<double> z =
            std::complex<double>(head[i0], head[i1]) * std::polar(1.0, (kOffset + t) * inv_freq[i]);
        head[i0] = z.real();
        head[i1] = z.imag();
      }
    }
}

struct Tables {
  std::vector<double> cos, sin;
};

Tables make_tables(const std::vector<double>& inv_freq) {
  Tables tab{std::vector<double>((kOffset + kT) * kD / 2), std::vector<double>((kOffset + kT) * kD / 2)};
  cpu::rope_tables(tab.cos.data(), tab.sin.data(), kOffset + kT, kD, inv_freq);
  return tab;
}

// Rotate the q heads and the k heads of a fused QKV buffer of B sequences in place: per group, its
// q heads and the k head right after them.
template <typename T>
void apply_qk(std::vector<T>& qkv, const T* cos, const T* sin, RopeLayout layout, bool inverse) {
  const int64_t B = static_cast<int64_t>(qkv.size()) / (kT * kStride);
  cpu::rope_apply(qkv.data(), cos, sin, B, kT, kHkv, kH / kHkv + 1, kD, {kStride, kGroup}, kOffset, layout, inverse);
}

// The tensor API's call on the fused QKV tensor of the tests above.
void apply_tensor(const ExecContext& ctx, const Tensor& x, const Tensor& cos, const Tensor& sin, RopeLayout layout,
                  bool inverse, int64_t pos_offset = kOffset, HeadStrides at = {kStride, kGroup}) {
  rope_apply(ctx, x, cos, sin, kB, kT, kHkv, kH / kHkv + 1, kD, at, pos_offset, layout, inverse);
}

using megaton::testing::tensor_of;
using megaton::testing::values;
using megaton::testing::zeros;

}  // namespace

TEST(Rope, InvFreqWithoutScalingIsThetaPower) {
  auto inv = rope_inv_freq(kD, 10000.0, RopeScaling{});
  ASSERT_EQ(inv.size(), static_cast<size_t>(kD / 2));
  for (int64_t i = 0; i < kD / 2; ++i) EXPECT_DOUBLE_EQ(inv[i], std::pow(10000.0, -2.0 * i / kD));
}

// Llama 3.2 settings. The expectation is written in the frequency domain (periods per original
// context, r = original / wavelen) instead of the kernel's wavelength comparisons.
TEST(Rope, InvFreqLlama3ScalingMatchesIndependentFormula) {
  const double theta = 500000.0, factor = 32.0, low = 1.0, high = 4.0, original = 8192.0;
  const int64_t D = 64;
  auto inv = rope_inv_freq(D, theta, RopeScaling{factor, low, high, original});
  int kept = 0, divided = 0, blended = 0;
  for (int64_t i = 0; i < D / 2; ++i) {
    const double f = std::exp(-std::log(theta) * 2.0 * i / D);
    const double r = original * f / (2.0 * std::numbers::pi);
    double want;
    if (r > high) {
      want = f, ++kept;
    } else if (r < low) {
      want = f / factor, ++divided;
    } else {
      const double alpha = (r - low) / (high - low);  // 0 at the low edge, 1 at the high edge
      want = f * (alpha + (1.0 - alpha) / factor), ++blended;
    }
    EXPECT_NEAR(inv[i], want, 1e-14 * want) << i;
  }
  // All three regimes occur for these settings.
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  EXPECT_DOUBLE_EQ(inv[D / 2 - 1], std::pow(theta, -62.0 / 64.0) / 32.0);
}

TEST(Rope, TablesHoldCosSinOfPositionTimesFrequency) {
  auto inv = rope_inv_freq(kD, 10000.0, RopeScaling{});
  Tables tab = make_tables(inv);
  for (int64_t t = 0; t < kOffset + kT; ++t)
    for (int64_t i = 0; i < kD / 2; ++i) {
      EXPECT_DOUBLE_EQ(tab.cos[t * kD / 2 + i], std::cos(t * inv[i]));
      EXPECT_DOUBLE_EQ(tab.sin[t * kD / 2 + i], std::sin(t * inv[i]));
    }
}

// Both layouts against an explicit complex rotation, in double and in float; v heads stay
// untouched; the inverse restores the input.
TEST(Rope, ApplyMatchesComplexRotationAndInverseRestores) {
  auto inv = rope_inv_freq(kD, 10000.0, RopeScaling{});
  Tables tab = make_tables(inv);
  std::vector<float> cosf(tab.cos.begin(), tab.cos.end()), sinf(tab.sin.begin(), tab.sin.end());
  for (RopeLayout layout : {RopeLayout::Half, RopeLayout::Interleaved}) {
    const auto input = fd::random_vector(kB * kT * kStride, 1);
    std::vector<double> want = input;
    for (int64_t g = 0; g < kHkv; ++g) {
      for (int64_t h = 0; h < kH / kHkv; ++h) rotate_reference(want.data(), g * kGroup + h * kD, inv, layout);  // q
      rotate_reference(want.data(), g * kGroup + kH / kHkv * kD, inv, layout);                                  // k
    }

    std::vector<double> got = input;
    apply_qk(got, tab.cos.data(), tab.sin.data(), layout, /*inverse=*/false);
    std::vector<float> gotf(input.begin(), input.end());
    apply_qk(gotf, cosf.data(), sinf.data(), layout, /*inverse=*/false);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-14) << i;
      EXPECT_NEAR(gotf[i], want[i], 1e-6) << i;
    }

    apply_qk(got, tab.cos.data(), tab.sin.data(), layout, /*inverse=*/true);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], input[i], 1e-14) << i;
  }
}

// Loss = sum(dout * rope(x)); the backward is the inverse rotation of dout (v heads pass through).
// One sequence keeps the O(size^2) finite differences cheap; batching is covered above.
TEST(Rope, InverseIsGradientByFiniteDifferences) {
  auto inv = rope_inv_freq(kD, 500000.0, RopeScaling{8.0, 1.0, 4.0, 64.0});
  Tables tab = make_tables(inv);
  for (RopeLayout layout : {RopeLayout::Half, RopeLayout::Interleaved}) {
    auto x = fd::random_vector(kT * kStride, 2);
    auto dout = fd::random_vector(x.size(), 3);
    std::vector<double> out;
    auto loss = [&] {
      out = x;
      apply_qk(out, tab.cos.data(), tab.sin.data(), layout, /*inverse=*/false);
      return fd::dot(dout, out);
    };
    std::vector<double> dx = dout;
    apply_qk(dx, tab.cos.data(), tab.sin.data(), layout, /*inverse=*/true);
    EXPECT_TRUE(fd::close(dx, fd::numeric_gradient(x, loss), 1e-8));
  }
}

// The tensor API computes exactly what the float template computes: the tables (with more rows than
// a call uses), then both layouts forward and inverse at a position offset, in a fused QKV tensor.
TEST(Rope, TensorApiEqualsTheFloatTemplate) {
  const ExecContext cpu_ctx;
  const auto inv = rope_inv_freq(kD, 500000.0, RopeScaling{8.0, 1.0, 4.0, 64.0});
  const int64_t P = kOffset + kT + 3;
  std::vector<float> cos_ref(P * kD / 2), sin_ref(P * kD / 2);
  cpu::rope_tables(cos_ref.data(), sin_ref.data(), P, kD, inv);
  Tensor cos = zeros({P, kD / 2}, "cos"), sin = zeros({P, kD / 2}, "sin");
  rope_tables(cpu_ctx, cos, sin, inv);
  EXPECT_TRUE(fd::same_bits(values(cos), cos_ref));
  EXPECT_TRUE(fd::same_bits(values(sin), sin_ref));

  const auto input = fd::random_vector<float>(kB * kT * kStride, 4);
  for (RopeLayout layout : {RopeLayout::Half, RopeLayout::Interleaved})
    for (bool inverse : {false, true}) {
      std::vector<float> want = input;
      apply_qk(want, cos_ref.data(), sin_ref.data(), layout, inverse);
      Tensor x = tensor_of(input, {kB * kT, kStride}, "qkv");
      apply_tensor(cpu_ctx, x, cos, sin, layout, inverse);
      EXPECT_TRUE(fd::same_bits(values(x), want)) << "layout " << int(layout) << ", inverse " << inverse;
    }
}

// bf16 q / k (bf16 training's attention input) rotate in fp32 with the f32 tables and are rounded
// once: the f32 template's result on the widened values, rounded to bf16, bit for bit.
TEST(Rope, Bf16RotatesInF32AndRoundsOnce) {
  using nn::as_dtype;
  const ExecContext cpu_ctx;
  const auto inv = rope_inv_freq(kD, 10000.0, RopeScaling{});
  const int64_t P = kOffset + kT;
  Tensor cos = zeros({P, kD / 2}, "cos"), sin = zeros({P, kD / 2}, "sin");
  rope_tables(cpu_ctx, cos, sin, inv);
  const Tensor input =
      as_dtype(tensor_of(fd::random_vector<float>(kB * kT * kStride, 5), {kB * kT, kStride}, "qkv"), DType::BF16);
  for (RopeLayout layout : {RopeLayout::Half, RopeLayout::Interleaved})
    for (bool inverse : {false, true}) {
      std::vector<float> want = values(as_dtype(input, DType::F32));
      apply_qk(want, cos.data<float>(), sin.data<float>(), layout, inverse);
      want = values(as_dtype(as_dtype(tensor_of(want, {kB * kT, kStride}, "want"), DType::BF16), DType::F32));
      Tensor x = as_dtype(as_dtype(input, DType::F32), DType::BF16);  // a copy to rotate
      apply_tensor(cpu_ctx, x, cos, sin, layout, inverse);
      EXPECT_TRUE(fd::same_bits(values(as_dtype(x, DType::F32)), want))
          << "layout " << int(layout) << ", inverse " << inverse;
    }
}

// Errors name the op and the tensor: a dtype mismatch, a dtype the cpu lacks, a tensor on another
// device, too few elements for the shape and strides (the last rotated k head ends D elements
// before the last row does, so that many elements are exactly enough), tables too short or of
// another width, a stride whose extent overflows int64, an undefined tensor.
TEST(Rope, TensorApiRejectsBadTensors) {
  const ExecContext cpu_ctx, gpu{Device::cuda(0), nullptr};
  const auto inv = rope_inv_freq(kD, 10000.0, RopeScaling{});
  const int64_t P = kOffset + kT, half = kD / 2;
  Tensor cos = zeros({P, half}, "cos"), sin = zeros({P, half}, "sin"), x = zeros({kB * kT, kStride}, "qkv");
  EXPECT_NO_THROW(rope_tables(cpu_ctx, cos, sin, inv));
  EXPECT_NO_THROW(apply_tensor(cpu_ctx, x, cos, sin, RopeLayout::Half, false));
  const Tensor fits = zeros({kB * kT * kStride - kD}, "fits");
  EXPECT_NO_THROW(apply_tensor(cpu_ctx, fits, cos, sin, RopeLayout::Interleaved, true));

  EXPECT_ERROR_CONTAINS(
      apply_tensor(cpu_ctx, zeros({kB * kT, kStride}, "qkv64", DType::F64), cos, sin, RopeLayout::Half, false),
      "kernel rope_apply", "'cos' holds f32, expected f64");
  EXPECT_ERROR_CONTAINS(apply_tensor(cpu_ctx, zeros({kB * kT, kStride}, "qkv_bf16", DType::BF16),
                                     zeros({P, half}, "cos_bf16", DType::BF16),
                                     zeros({P, half}, "sin_bf16", DType::BF16), RopeLayout::Half, false),
                        "kernel rope_apply", "'cos_bf16' holds bf16, expected f32");
  EXPECT_ERROR_CONTAINS(
      apply_tensor(cpu_ctx, zeros({kB * kT, kStride}, "qkv_f16", DType::F16), zeros({P, half}, "cos_f16", DType::F16),
                   zeros({P, half}, "sin_f16", DType::F16), RopeLayout::Half, false),
      "kernel rope_apply on cpu does not support dtype f16");
  EXPECT_ERROR_CONTAINS(apply_tensor(gpu, x, cos, sin, RopeLayout::Half, false),
                        "kernel rope_apply: tensor 'qkv' is on cpu, the call runs on cuda:0");
  EXPECT_ERROR_CONTAINS(
      apply_tensor(cpu_ctx, zeros({kB * kT * kStride - kD - 1}, "short_qkv"), cos, sin, RopeLayout::Half, false),
      "kernel rope_apply: tensor 'short_qkv' has", "need " + std::to_string(kB * kT * kStride - kD));
  EXPECT_ERROR_CONTAINS(apply_tensor(cpu_ctx, x, cos, sin, RopeLayout::Half, false, kOffset + 1), "kernel rope_apply",
                        "rows of table 'cos', it has " + std::to_string(P));
  EXPECT_ERROR_CONTAINS(apply_tensor(cpu_ctx, x, cos, zeros({P - 1, half}, "short_sin"), RopeLayout::Half, false),
                        "kernel rope_apply", "'short_sin' has shape");
  EXPECT_ERROR_CONTAINS(apply_tensor(cpu_ctx, x, cos, sin, RopeLayout::Half, false, kOffset,
                                     {std::numeric_limits<int64_t>::max() / 8, kGroup}),
                        "kernel rope_apply", "strides given for tensor 'qkv' overflow int64");
  EXPECT_ERROR_CONTAINS(apply_tensor(cpu_ctx, Tensor(), cos, sin, RopeLayout::Half, false), "kernel rope_apply",
                        "undefined");

  EXPECT_ERROR_CONTAINS(rope_tables(cpu_ctx, cos, zeros({P, half}, "sin64", DType::F64), inv), "kernel rope_tables",
                        "'sin64' holds f64, expected f32");
  EXPECT_ERROR_CONTAINS(rope_tables(cpu_ctx, zeros({P, half + 1}, "wide_cos"), sin, inv), "kernel rope_tables",
                        "'wide_cos' has shape [" + std::to_string(P) + ", " + std::to_string(half + 1) + "]");
  EXPECT_ERROR_CONTAINS(rope_tables(gpu, cos, sin, inv), "kernel rope_tables: tensor 'cos' is on cpu");
}

// On a CUDA device RoPE rotates f32 (backend_test checks its values); other dtypes are an error
// naming the op and the tensor.
TEST(Rope, TensorApiOnCudaRotatesF32Only) {
#ifdef MEGATON_WITH_CUDA
  if (megaton::cuda::device_count() == 0) GTEST_SKIP() << "skipped: no CUDA device";
  const ExecContext gpu{Device::cuda(0), nullptr};
  const auto on_gpu = [](Shape shape, const std::string& name) {
    Tensor t = zeros(std::move(shape), name).to(DType::BF16).to(Device::cuda(0));
    t.set_name(name);
    return t;
  };
  const Tensor cos = on_gpu({kOffset + kT, kD / 2}, "cos"), sin = on_gpu({kOffset + kT, kD / 2}, "sin");
  EXPECT_ERROR_CONTAINS(apply_tensor(gpu, on_gpu({kB * kT, kStride}, "qkv"), cos, sin, RopeLayout::Half, false),
                        "kernel rope_apply on cuda: tensor 'qkv' holds bf16, expected f32");
#else
  GTEST_SKIP() << "skipped: built without CUDA";
#endif
}
