// FP8 on the CUDA backend against the CPU: quantisation (per tensor current and delayed, 1x128 tiles,
// 128x128 blocks; rowwise and transposed; E4M3 and E5M2; power-of-two scales; f32 and bf16 inputs;
// ragged edges; a NaN) must give the same codes, scale_inv and amax bit for bit, and the cuBLASLt
// FP8 GEMM (per-tensor, HYBRID's E5M2 x E4M3, DeepSeek-V3's 1x128 x 128x128 and both orders, the
// 1x128 x 1x128 weight gradient; bf16 and f32 outputs, accumulation, bias) must equal the double
// reference of the same codes and scales within the accumulation error of Hopper's FP8 tensor cores,
// a bound one wrong tile scale exceeds. Outputs start as NaN. Without a CUDA
// device every case reports "skipped: no CUDA device".
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include "../support/fp8_reference.h"
#include "megaton/kernels/fp8_gemm.h"
#ifdef MEGATON_WITH_CUDA
#include "megaton/core/cuda/cuda_memory.h"
#endif

namespace megaton::kernels {
namespace {

using G = Fp8Granularity;

class Fp8Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
#ifdef MEGATON_WITH_CUDA
    if (cuda::device_count() == 0) GTEST_SKIP() << "skipped: no CUDA device";
#else
    GTEST_SKIP() << "skipped: built without CUDA";
#endif
  }
  static constexpr Device gpu() { return Device::cuda(0); }
};

// Bit-for-bit equality of two FP8 matrices (the GPU one brought to the host), naming what differs.
::testing::AssertionResult identical(const Fp8Matrix& cpu, const Fp8Matrix& gpu_result) {
  const Fp8Matrix g = gpu_result.to(Device::cpu());
  if (cpu.data.shape() != g.data.shape() || cpu.scale_inv.shape() != g.scale_inv.shape() || cpu.data.dtype() != g.data.dtype())
    return ::testing::AssertionFailure() << "shapes or dtype differ: codes " << shape_str(g.data.shape()) << " vs "
                                         << shape_str(cpu.data.shape()) << ", scales " << shape_str(g.scale_inv.shape())
                                         << " vs " << shape_str(cpu.scale_inv.shape());
  const auto* a = static_cast<const uint8_t*>(cpu.data.raw());
  const auto* b = static_cast<const uint8_t*>(g.data.raw());
  for (int64_t i = 0; i < cpu.data.numel(); ++i)
    if (a[i] != b[i])
      return ::testing::AssertionFailure() << "code " << i << " (row " << i / cpu.data.size(1) << ", col "
                                           << i % cpu.data.size(1) << "): cuda 0x" << std::hex << int{b[i]}
                                           << ", cpu 0x" << int{a[i]};
  for (int64_t i = 0; i < cpu.scale_inv.numel(); ++i)
    if (cpu.scale_inv.data<float>()[i] != g.scale_inv.data<float>()[i])
      return ::testing::AssertionFailure() << "scale_inv " << i << ": cuda " << g.scale_inv.data<float>()[i]
                                           << ", cpu " << cpu.scale_inv.data<float>()[i];
  uint32_t ca, ga;
  std::memcpy(&ca, &cpu.amax, 4);
  std::memcpy(&ga, &g.amax, 4);
  if (ca != ga) return ::testing::AssertionFailure() << "amax: cuda " << g.amax << ", cpu " << cpu.amax;
  return ::testing::AssertionSuccess();
}

struct QuantizeCase {
  G granularity;
  bool transpose;
  fp8::Format format;
  bool pow2;
  float given_scale;  // 0: current scaling
};

TEST_F(Fp8Cuda, QuantizeMatchesTheCpuBitForBit) {
  const QuantizeCase cases[] = {
      {G::Tensor, false, fp8::Format::E4M3, false, 0},   {G::Tensor, true, fp8::Format::E4M3, false, 0},
      {G::Tensor, false, fp8::Format::E5M2, false, 0},   {G::Tensor, false, fp8::Format::E4M3, false, 3.5f},
      {G::Tensor, true, fp8::Format::E5M2, true, 0},     {G::Tile1x128, false, fp8::Format::E4M3, false, 0},
      {G::Tile1x128, true, fp8::Format::E4M3, false, 0}, {G::Tile1x128, false, fp8::Format::E5M2, true, 0},
      {G::Tile1x128, true, fp8::Format::E5M2, true, 0},  {G::Block128x128, false, fp8::Format::E4M3, false, 0},
      {G::Block128x128, true, fp8::Format::E4M3, true, 0}, {G::Block128x128, true, fp8::Format::E5M2, false, 0},
  };
  // 300 x 200: ragged 1x128 tiles, 128x128 blocks and 32-column chunks in both directions; values
  // spread over 2^±4 with some exact zeros and a tiny subnormal-range run.
  Tensor x = test::fp8_test_matrix(300, 200, 11, 4.0f);
  for (int64_t c = 0; c < 40; ++c) x.data<float>()[5 * 200 + c] = 0.0f;
  for (int64_t c = 0; c < 40; ++c) x.data<float>()[7 * 200 + c] = 1e-9f * static_cast<float>(c);
  for (DType dtype : {DType::F32, DType::BF16}) {
    const Tensor host = x.to(dtype), device = host.to(gpu());
    for (const QuantizeCase& c : cases) {
      Fp8QuantizeOptions o{.format = c.format, .granularity = c.granularity, .pow2_scales = c.pow2, .transpose = c.transpose};
      if (c.given_scale > 0) o.scale = c.given_scale;
      EXPECT_TRUE(identical(fp8_quantize(host, o, "q"), fp8_quantize(device, o, "q")))
          << dtype_name(dtype) << " " << granularity_name(c.granularity) << (c.transpose ? " transposed " : " ")
          << fp8::info(c.format).name << (c.pow2 ? " pow2" : "") << (c.given_scale > 0 ? " given scale" : "");
    }
  }
}

TEST_F(Fp8Cuda, QuantizeKeepsANanAndAnEmptyMatrixLikeTheCpu) {
  Tensor x = test::fp8_test_matrix(130, 260, 12, 1.0f);
  x.data<float>()[129 * 260 + 259] = std::numeric_limits<float>::quiet_NaN();
  const Tensor device = x.to(gpu());
  for (G g : {G::Tensor, G::Tile1x128, G::Block128x128})
    for (bool transpose : {false, true}) {
      const Fp8QuantizeOptions o{.granularity = g, .transpose = transpose};
      const Fp8Matrix cpu = fp8_quantize(x, o, "q"), cuda = fp8_quantize(device, o, "q");
      EXPECT_TRUE(std::isnan(cuda.amax));
      EXPECT_TRUE(identical(cpu, cuda)) << granularity_name(g) << (transpose ? " transposed" : "");
    }
  const Tensor empty = Tensor::empty({0, 64}, DType::F32, MemCategory::Other, "empty", gpu());
  const Fp8Matrix q = fp8_quantize(empty, {.granularity = G::Tile1x128}, "q");
  EXPECT_EQ(q.data.numel(), 0);
  EXPECT_EQ(q.amax, 0.0f);
}

struct GemmCase {
  const char* name;
  G ga, gb;
  fp8::Format fa, fb;
  int64_t group;  // the K group width of the reference (K for per-tensor)
};

struct GemmRun {
  int64_t M, N, K;
  DType out;
  bool accumulate, bias;
};

// Hopper's FP8 tensor cores keep about 14 mantissa bits inside an MMA chunk (DeepSeek-V3, section
// 3.3.2); cuBLASLt (without fast accumulation) promotes the chunks' sums to fp32. Measured on an
// H200 the error relative to sum |terms| is 2e-4 to 3.4e-4 for K = 384 and 400, so the bound is 2^-10
// of that sum: far below what one wrong tile scale does (ToleranceCatchesOneWrongTileScale).
constexpr double kFp8AccumulationError = 0x1p-10;

// The worst |out - reference| / allowed of out (f32 or bf16, on the GPU) = a b^T (+ acc0) (+ bias)
// against the double reference of the same codes and scales: Hopper's accumulation error, plus bf16
// rounding of the result for a bf16 output. With `corrupt_scale`, a's first scale is doubled on the
// GPU copy only (a planted bug the comparison must see).
double gemm_error(const GemmCase& c, const GemmRun& r, bool corrupt_scale = false) {
  const int64_t M = r.M, N = r.N, K = r.K;
  const Fp8Matrix a = fp8_quantize(test::fp8_test_matrix(M, K, 21, 3.0f), {.format = c.fa, .granularity = c.ga}, "a");
  const Fp8Matrix b = fp8_quantize(test::fp8_test_matrix(N, K, 22, 2.0f), {.format = c.fb, .granularity = c.gb}, "b");
  const Tensor acc0 = test::fp8_test_matrix(M, N, 23, 0.0f);
  const Tensor bias_host = test::fp8_test_matrix(1, N, 24, 0.0f).to(DType::BF16);
  Tensor start = acc0;  // accumulate onto acc0; otherwise start from NaN, which must be overwritten
  if (!r.accumulate) {
    start = Tensor::empty({M, N}, DType::F32, MemCategory::Other, "out");
    std::fill_n(start.data<float>(), M * N, std::numeric_limits<float>::quiet_NaN());
  }
  Tensor out = start.to(r.out).to(Device::cuda(0));
  Fp8Matrix a_gpu = a.to(Device::cuda(0));
  if (corrupt_scale) {
    Tensor wrong = a.scale_inv.clone(MemCategory::Other);
    wrong.data<float>()[0] *= 2.0f;
    a_gpu.scale_inv = wrong.to(Device::cuda(0));
  }
  fp8_gemm({Device::cuda(0), nullptr}, out, a_gpu, b.to(Device::cuda(0)), r.accumulate,
           r.bias ? bias_host.to(Device::cuda(0)) : Tensor());
  const Tensor got = out.to(Device::cpu()).to(DType::F32);
  const Tensor bias_f = bias_host.to(DType::F32);
  const int64_t group = c.group == 0 ? K : c.group;
  double worst = 0, worst_relative = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double magnitude = 0;
      double ref = test::fp8_reference_at(a, b, m, n, group, &magnitude);
      if (r.accumulate) ref += acc0.data<float>()[m * N + n], magnitude += std::fabs(acc0.data<float>()[m * N + n]);
      if (r.bias) ref += bias_f.data<float>()[n], magnitude += std::fabs(bias_f.data<float>()[n]);
      const double v = got.data<float>()[m * N + n];
      if (!std::isfinite(v)) return std::numeric_limits<double>::infinity();
      const double bf16_rounding = r.out == DType::BF16 ? std::ldexp(std::fabs(ref), -8) : 0.0;
      worst = std::max(worst, std::fabs(v - ref) / (kFp8AccumulationError * magnitude + bf16_rounding + 1e-30));
      worst_relative = std::max(worst_relative, std::fabs(v - ref) / (magnitude + 1e-30));
    }
  std::printf("%s %s%s%s M %ld N %ld K %ld%s: worst |error| / sum|terms| %.3g\n", c.name,
              std::string(dtype_name(r.out)).c_str(), r.accumulate ? " accumulate" : "", r.bias ? " bias" : "", M, N,
              K, corrupt_scale ? " (scale corrupted)" : "", worst_relative);
  return worst;
}

const GemmCase kTensor{"tensor_e4m3", G::Tensor, G::Tensor, fp8::Format::E4M3, fp8::Format::E4M3, 0};
const GemmCase kHybrid{"hybrid_e5m2_x_e4m3", G::Tensor, G::Tensor, fp8::Format::E5M2, fp8::Format::E4M3, 0};
const GemmCase kForward{"1x128_x_128x128", G::Tile1x128, G::Block128x128, fp8::Format::E4M3, fp8::Format::E4M3, 128};
const GemmCase kBlockFirst{"128x128_x_1x128", G::Block128x128, G::Tile1x128, fp8::Format::E4M3, fp8::Format::E4M3, 128};
const GemmCase kWgrad{"1x128_x_1x128", G::Tile1x128, G::Tile1x128, fp8::Format::E4M3, fp8::Format::E4M3, 128};

TEST_F(Fp8Cuda, PerTensorGemmMatchesTheReference) {
  for (const GemmCase& c : {kTensor, kHybrid}) {
    EXPECT_LE(gemm_error(c, {136, 264, 384, DType::BF16, false, false}), 1.0) << c.name << " bf16";
    EXPECT_LE(gemm_error(c, {136, 264, 384, DType::F32, true, false}), 1.0) << c.name << " f32 accumulate";
  }
  EXPECT_LE(gemm_error(kTensor, {136, 264, 384, DType::BF16, false, true}), 1.0) << "bf16 bias";
  EXPECT_LE(gemm_error(kTensor, {136, 264, 384, DType::F32, false, true}), 1.0) << "f32 bias";
}

TEST_F(Fp8Cuda, BlockScaledGemmMatchesTheReference) {
  for (const GemmCase& c : {kForward, kBlockFirst, kWgrad}) {
    EXPECT_LE(gemm_error(c, {136, 264, 384, DType::BF16, false, false}), 1.0) << c.name << " bf16";
    EXPECT_LE(gemm_error(c, {136, 264, 384, DType::F32, true, false}), 1.0) << c.name << " f32 accumulate";
  }
}

TEST_F(Fp8Cuda, BlockScaledGemmWithARaggedKGroup) {
  // K = 400: the last 1x128 tile and 128x128 block are 16 wide.
  for (const GemmCase& c : {kForward, kWgrad}) EXPECT_LE(gemm_error(c, {136, 264, 400, DType::F32, false, false}), 1.0) << c.name;
}

TEST_F(Fp8Cuda, ToleranceCatchesOneWrongTileScale) {
  // One 1x128 tile of one row at twice its scale: the comparison above must fail on it.
  EXPECT_GT(gemm_error(kForward, {136, 264, 384, DType::F32, false, false}, /*corrupt_scale=*/true), 1.0);
  EXPECT_GT(gemm_error(kWgrad, {136, 264, 384, DType::BF16, false, false}, /*corrupt_scale=*/true), 1.0);
}

TEST_F(Fp8Cuda, UnsupportedPairingsAreRefusedByName) {
  const Fp8Matrix a = fp8_quantize(test::fp8_test_matrix(64, 128, 1, 1.0f).to(gpu()), {.granularity = G::Block128x128});
  const Fp8Matrix b = fp8_quantize(test::fp8_test_matrix(32, 128, 2, 1.0f).to(gpu()), {.granularity = G::Block128x128});
  Tensor out = Tensor::empty({64, 32}, DType::F32, MemCategory::Other, "out", gpu());
  try {
    fp8_gemm({gpu(), nullptr}, out, a, b);
    FAIL() << "128x128 x 128x128 ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("no 128x128 x 128x128"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace megaton::kernels
