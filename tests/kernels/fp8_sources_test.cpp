// The fused FP8 producers (kernels/fp8_sources.h) against the unfused kernels: a norm's statistics
// and output, and an activation's output, quantised straight from the producer give bitwise the
// codes and scales of quantising what the unfused f32 kernel writes (for bf16 inputs: the f32
// kernel on the widened inputs, since the producer skips the rounding to bf16), in both layouts and
// every granularity, across several of the quantiser's 128 x 512 blocks with ragged edges.
#include <gtest/gtest.h>

#include <cstring>

#include "../support/host_tensors.h"
#include "finite_diff.h"
#include "megaton/kernels/activation.h"
#include "megaton/kernels/fp8_sources.h"
#include "megaton/kernels/norm.h"

using namespace megaton;
using namespace megaton::kernels;

namespace {

const ExecContext kCpu = ExecContext::on(Tensor::empty({1}, DType::F32));
constexpr Fp8Granularity kGranularities[] = {Fp8Granularity::Tensor, Fp8Granularity::Tile1x128,
                                             Fp8Granularity::Block128x128, Fp8Granularity::Mx1x32};

Tensor random_f32(Shape shape, uint64_t seed, double scale = 1.0) {
  Tensor t = Tensor::empty(shape, DType::F32, MemCategory::Other, "x" + std::to_string(seed));
  const auto v = fd::random_vector<float>(static_cast<size_t>(t.numel()), seed, -scale, scale);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

// x in `dtype`, and the f32 tensor holding exactly its values (x itself in f32).
std::pair<Tensor, Tensor> in_dtype(const Tensor& x32, DType dtype) {
  if (dtype == DType::F32) return {x32, x32};
  const Tensor x = x32.to(dtype, MemCategory::Other);
  return {x, x.to(DType::F32, MemCategory::Other)};
}

bool same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

void expect_same_quantisation(const Fp8Source& fused, const Tensor& written, const std::string& what) {
  for (const Fp8Granularity g : kGranularities) {
    SCOPED_TRACE(what + " " + std::string(granularity_name(g)));
    const Fp8Layouts a = fp8_quantize_both(fused, {.granularity = g}, "fused", "fused_t");
    const Fp8Layouts b = fp8_quantize_both(fp8_source(written), {.granularity = g}, "ref", "ref_t");
    EXPECT_TRUE(same(a.rowwise.data, b.rowwise.data));
    EXPECT_TRUE(same(a.rowwise.scale_inv, b.rowwise.scale_inv));
    EXPECT_TRUE(same(a.columnwise.data, b.columnwise.data));
    EXPECT_TRUE(same(a.columnwise.scale_inv, b.columnwise.scale_inv));
    EXPECT_EQ(a.rowwise.amax, b.rowwise.amax);
  }
}

}  // namespace

TEST(Fp8Sources, NormOutputQuantisedFromItsStatisticsIsTheWrittenOutputQuantised) {
  const int64_t N = 300, C = 700;  // 3 x 2 blocks, ragged
  const Tensor w = random_f32({C}, 1), b = random_f32({C}, 2);
  for (const DType dtype : {DType::F32, DType::BF16})
    for (const bool rms : {false, true})
      for (const bool residual : {false, true}) {
        const std::string what = std::string(dtype_name(dtype)) + (rms ? " rmsnorm" : " layernorm") +
                                 (residual ? " + residual" : "");
        SCOPED_TRACE(what);
        const auto [x, x_wide] = in_dtype(random_f32({N, C}, 3, 4.0), dtype);
        const auto [r, r_wide] = in_dtype(random_f32({N, C}, 4), dtype);
        // Reference: the f32 kernel on the exact values, after the same residual sum (in dtype).
        Tensor sum_ref = x.clone(MemCategory::Other);
        if (residual) residual_forward(kCpu, sum_ref, sum_ref, r);
        const Tensor sum_wide = sum_ref.to(DType::F32, MemCategory::Other);
        Tensor y = Tensor::empty({N, C}, DType::F32), mean_ref = Tensor::empty({N}, DType::F32), rstd_ref = Tensor::empty({N}, DType::F32);
        rms ? rmsnorm_forward(kCpu, y, rstd_ref, sum_wide, w, 1e-5)
            : layernorm_forward(kCpu, y, mean_ref, rstd_ref, sum_wide, w, b, 1e-5);
        // Fused: statistics (and the sum, in x's storage) only, then the producer.
        Tensor xs = x.clone(MemCategory::Other);
        Tensor mean = rms ? Tensor() : Tensor::empty({N}, DType::F32), rstd = Tensor::empty({N}, DType::F32);
        norm_statistics(kCpu, residual ? xs : Tensor(), mean, rstd, xs, residual ? r : Tensor(), 1e-5);
        EXPECT_TRUE(same(xs, sum_ref));
        EXPECT_TRUE(same(rstd, rstd_ref));
        if (!rms) {
          EXPECT_TRUE(same(mean, mean_ref));
        }
        expect_same_quantisation(norm_fp8_source(xs, mean, rstd, w, rms ? Tensor() : b, "norm"), y, what);
      }
}

TEST(Fp8Sources, ActivationQuantisedFromFc1OutputIsTheWrittenActivationQuantised) {
  const int64_t N = 260, F = 600;
  for (const DType dtype : {DType::F32, DType::BF16})
    for (const bool swiglu : {false, true})
      for (const bool with_bias : {false, true}) {
        const std::string what = std::string(dtype_name(dtype)) + (swiglu ? " swiglu" : " gelu") +
                                 (with_bias ? " + bias" : "");
        SCOPED_TRACE(what);
        const int64_t width = swiglu ? 2 * F : F;
        const auto [h, h_wide] = in_dtype(random_f32({N, width}, 7, 3.0), dtype);
        const Tensor bias = with_bias ? random_f32({width}, 8) : Tensor();
        Tensor a = Tensor::empty({N, F}, DType::F32);
        if (with_bias)
          swiglu ? bias_swiglu_forward(kCpu, a, h_wide, bias) : bias_gelu_forward(kCpu, a, h_wide, bias);
        else
          swiglu ? swiglu_forward(kCpu, a, h_wide) : gelu_forward(kCpu, a, h_wide);
        expect_same_quantisation(activation_fp8_source(h, bias, swiglu, "act"), a, what);
      }
}

TEST(Fp8Sources, BadInputsAreRefusedByName) {
  const Tensor h = random_f32({4, 7}, 9);
  EXPECT_THROW(activation_fp8_source(h, Tensor(), /*swiglu=*/true, "act"), Error);  // odd width
  EXPECT_THROW(activation_fp8_source(h, random_f32({6}, 10), false, "act"), Error);  // bias width
  const Tensor f16 = h.to(DType::F16, MemCategory::Other);
  EXPECT_THROW(activation_fp8_source(f16, Tensor(), false, "act"), Error);
  EXPECT_THROW(norm_fp8_source(h, Tensor(), random_f32({4}, 11), random_f32({6}, 12), Tensor(), "norm"), Error);
}
