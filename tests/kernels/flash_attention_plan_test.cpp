// The host-side plan of the CUDA flash attention (no GPU needed): which inputs the bf16 / fp16
// kernels take, and tile sizes and shared memory that fit the GPUs they are built for.
#include "megaton/kernels/flash_attention_plan.h"

#include <gtest/gtest.h>

namespace megaton::kernels {
namespace {

TEST(FlashAttentionPlan, TakesTheInstantiatedHeadSizesInHalfPrecisionOnly) {
  for (HeadDim d : {HeadDim{32}, HeadDim{64}, HeadDim{128}, HeadDim{192}, HeadDim{192, 128}}) {
    EXPECT_EQ(flash_attention_unsupported(DType::BF16, d, 2, 32, 8, {0, 64, 1024}), "") << d.qk << "/" << d.v;
    EXPECT_EQ(flash_attention_unsupported(DType::F16, d, 2, 32, 8, {}), "") << d.qk << "/" << d.v;
  }
  EXPECT_NE(flash_attention_unsupported(DType::F32, 64, 1, 1, 1, {}).find("bf16 or f16, not f32"), std::string::npos);
  for (HeadDim d : {HeadDim{16}, HeadDim{80}, HeadDim{256}, HeadDim{128, 64}, HeadDim{192, 64}})
    EXPECT_NE(flash_attention_unsupported(DType::BF16, d, 1, 1, 1, {}).find("head dims"), std::string::npos)
        << d.qk << "/" << d.v;
}

TEST(FlashAttentionPlan, NeedsSixteenByteAlignedHeadsAndAGridThatFits) {
  EXPECT_NE(flash_attention_unsupported(DType::BF16, 64, 1, 1, 1, {0, 4}).find("multiple of 8 elements, got 4"),
            std::string::npos);
  EXPECT_NE(flash_attention_unsupported(DType::BF16, 64, 1, 1, 1, {8, 12}).find("got 12"), std::string::npos);
  EXPECT_EQ(flash_attention_unsupported(DType::BF16, 64, 65535, 65535, 1, {}), "");
  EXPECT_NE(flash_attention_unsupported(DType::BF16, 64, 65536, 1, 1, {}).find("at most 65535"), std::string::npos);
  EXPECT_NE(flash_attention_unsupported(DType::BF16, 64, 1, 65536, 1, {}).find("at most 65535"), std::string::npos);
}

TEST(FlashAttentionPlan, TilesAndSharedMemoryFitAmpereAndHopper) {
  // Dynamic shared memory a block may opt into: 163 KiB on sm_80, 227 KiB on sm_90.
  constexpr size_t kSm80 = 166912;
  for (HeadDim d : {HeadDim{32}, HeadDim{64}, HeadDim{128}, HeadDim{192}, HeadDim{192, 128}}) {
    const FlashAttentionPlan p = flash_attention_plan(d, 1000, 1000);
    EXPECT_LE(p.forward_smem, kSm80);
    EXPECT_LE(p.dq_smem, kSm80);
    EXPECT_LE(p.dkv_smem, kSm80);
    // 16 rows per warp, whole m16n8k16 steps along every head.
    EXPECT_EQ(d.qk % 16, 0);
    EXPECT_EQ(d.v % 16, 0);
    EXPECT_EQ(p.kv_q_tile % 16, 0);
  }
  // Head dim 128: two buffers of a K and a V tile and the Q rows (64 x 136 bf16 each).
  const FlashAttentionPlan p = flash_attention_plan(128, 1000, 1037);
  EXPECT_EQ(p.forward_smem, size_t{5 * 64 * 136 * 2});
  EXPECT_EQ(p.kv_q_tile, 64);
  EXPECT_EQ(p.q_blocks, 16);   // ceil(1000 / 64)
  EXPECT_EQ(p.kv_blocks, 17);  // ceil(1037 / 64)
  // Wide heads step 32 query rows at a time in the dk / dv kernel (register budget).
  EXPECT_EQ(flash_attention_plan(192, 64, 64).kv_q_tile, 32);
  EXPECT_EQ(flash_attention_plan({192, 128}, 64, 64).kv_q_tile, 32);
  EXPECT_EQ(flash_attention_plan(64, 1, 1).q_blocks, 1);
}

}  // namespace
}  // namespace megaton::kernels
