// The host-side plan of the CUDA FP8 GEMM (kernels/fp8_gemm_cublas.h), checked without a GPU: which
// operand pairings, formats, sizes and biases cuBLASLt on Hopper takes, each refusal naming why, and
// the scale layouts the block modes read.
#include "megaton/kernels/fp8_gemm_cublas.h"

#include <gtest/gtest.h>

#include "../support/fp8_reference.h"

namespace megaton::kernels {
namespace {

using G = Fp8Granularity;

Fp8Matrix operand(int64_t rows, int64_t cols, G g, fp8::Format f = fp8::Format::E4M3) {
  return fp8_quantize(test::fp8_test_matrix(rows, cols, 1, 1.0f), {.format = f, .granularity = g});
}

TEST(CublasFp8Plan, TakesTheRecipesPairings) {
  const Tensor none;
  EXPECT_EQ(cublas_fp8_unsupported(operand(64, 128, G::Tensor), operand(32, 128, G::Tensor), DType::BF16, none), "");
  EXPECT_EQ(cublas_fp8_unsupported(operand(64, 128, G::Tensor, fp8::Format::E5M2), operand(32, 128, G::Tensor),
                                   DType::F32, none),
            "");
  EXPECT_EQ(cublas_fp8_unsupported(operand(64, 256, G::Tile1x128), operand(32, 256, G::Block128x128), DType::BF16, none),
            "");
  EXPECT_EQ(cublas_fp8_unsupported(operand(64, 256, G::Block128x128), operand(32, 256, G::Tile1x128), DType::BF16, none),
            "");
  EXPECT_EQ(cublas_fp8_unsupported(operand(64, 256, G::Tile1x128), operand(32, 256, G::Tile1x128), DType::F32, none), "");
  Tensor bias = Tensor::zeros({32}, DType::BF16, MemCategory::Other, "bias");
  EXPECT_EQ(cublas_fp8_unsupported(operand(64, 128, G::Tensor), operand(32, 128, G::Tensor), DType::BF16, bias), "");
}

TEST(CublasFp8Plan, RefusalsNameTheReason) {
  const Tensor none;
  const auto why = [&](const Fp8Matrix& a, const Fp8Matrix& b, DType out = DType::BF16, const Tensor& bias = {}) {
    return cublas_fp8_unsupported(a, b, out, bias);
  };
  EXPECT_NE(why(operand(64, 128, G::Mx1x32), operand(32, 128, G::Mx1x32)).find("Blackwell"), std::string::npos);
  EXPECT_NE(why(operand(64, 128, G::Block128x128), operand(32, 128, G::Block128x128)).find("no 128x128 x 128x128"),
            std::string::npos);
  EXPECT_NE(why(operand(64, 128, G::Tile1x128), operand(32, 128, G::Tensor)).find("do not mix"), std::string::npos);
  EXPECT_NE(why(operand(64, 128, G::Tensor, fp8::Format::E5M2), operand(32, 128, G::Tensor, fp8::Format::E5M2))
                .find("E5M2 x E5M2"),
            std::string::npos);
  EXPECT_NE(why(operand(64, 128, G::Tile1x128, fp8::Format::E5M2), operand(32, 128, G::Block128x128)).find("E4M3"),
            std::string::npos);
  EXPECT_NE(why(operand(64, 120, G::Tensor), operand(32, 120, G::Tensor)).find("K = 120"), std::string::npos);
  EXPECT_NE(why(operand(64, 128, G::Tile1x128), operand(36, 128, G::Block128x128)).find("N = 36"), std::string::npos);
  EXPECT_NE(why(operand(60, 128, G::Tile1x128), operand(32, 128, G::Block128x128)).find("M = 60"), std::string::npos);
  EXPECT_NE(why(operand(64, 128, G::Tensor), operand(32, 128, G::Tensor), DType::F16).find("f32 or bf16"),
            std::string::npos);
  Tensor f32_bias = Tensor::zeros({32}, DType::F32, MemCategory::Other, "f32_bias");
  EXPECT_NE(why(operand(64, 128, G::Tensor), operand(32, 128, G::Tensor), DType::F32, f32_bias).find("'f32_bias' must be bf16"),
            std::string::npos);
  Tensor bias = Tensor::zeros({32}, DType::BF16, MemCategory::Other, "bias");
  EXPECT_NE(why(operand(64, 128, G::Tile1x128), operand(32, 128, G::Block128x128), DType::BF16, bias).find("per-tensor"),
            std::string::npos);
}

TEST(CublasFp8Plan, ScaleLayouts) {
  // 1x128 tiles of [202, 384]: scale_inv [202, 3] becomes [3 K groups, 202 rows padded to 204].
  const CublasScaleLayout tile = cublas_scale_layout(operand(202, 384, G::Tile1x128));
  EXPECT_EQ(tile.outer, 3);
  EXPECT_EQ(tile.inner, 204);
  EXPECT_TRUE(tile.transposed);
  // 128x128 blocks of [300, 520]: scale_inv [3, 5] stays row-major with 5 K blocks padded to 8.
  const CublasScaleLayout block = cublas_scale_layout(operand(300, 520, G::Block128x128));
  EXPECT_EQ(block.outer, 3);
  EXPECT_EQ(block.inner, 8);
  EXPECT_FALSE(block.transposed);
  const CublasScaleLayout tensor = cublas_scale_layout(operand(300, 520, G::Tensor));
  EXPECT_EQ(tensor.outer * tensor.inner, 1);
}

}  // namespace
}  // namespace megaton::kernels
