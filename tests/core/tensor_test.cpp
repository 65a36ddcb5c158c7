#include <gtest/gtest.h>

#include <cmath>

#include "megaton/core/allocator.h"
#include "megaton/core/rng.h"
#include "megaton/core/tensor.h"

#include "../support/temp_dir.h"

using namespace megaton;

TEST(Tensor, AllocatorCountsLiveAndPeakPerCategory) {
  auto& a = Allocator::host();
  auto before = a.stats();
  size_t i = static_cast<size_t>(MemCategory::Activations);
  {
    Tensor t = Tensor::empty({10, 10}, DType::F32, MemCategory::Activations, "act");
    EXPECT_EQ(a.stats().live[i], before.live[i] + 400);
    Tensor u = Tensor::empty({5}, DType::F64, MemCategory::Activations, "act2");
    EXPECT_EQ(a.stats().live[i], before.live[i] + 440);
    EXPECT_GE(a.stats().peak[i], before.live[i] + 440);
  }
  EXPECT_EQ(a.stats().live[i], before.live[i]);
}

TEST(Tensor, ViewSharesStorageAndChecksNumel) {
  Tensor t = Tensor::zeros({2, 6}, DType::F32, MemCategory::Other, "x");
  Tensor v = t.view({3, 4});
  v.data<float>()[5] = 7.0f;
  EXPECT_EQ(t.data<float>()[5], 7.0f);
  EXPECT_THROW(t.view({5}), Error);
  try {
    t.view({5});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'x'"), std::string::npos);
  }
}

TEST(Tensor, WrongDtypeAccessNamesTensor) {
  Tensor t = Tensor::zeros({3}, DType::I32, MemCategory::Other, "ids");
  try {
    t.data<float>();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ids"), std::string::npos);
  }
}

TEST(Tensor, Bf16AndF16ConversionsRoundTrip) {
  for (float f : {0.0f, 1.0f, -2.5f, 3.140625f, 65504.0f, 1e-6f}) {
    EXPECT_EQ(f16_to_float(float_to_f16(f)), f16_to_float(float_to_f16(f16_to_float(float_to_f16(f)))));
    EXPECT_NEAR(f16_to_float(float_to_f16(f)), f, std::abs(f) * 1e-3 + 6e-8);
    EXPECT_NEAR(bf16_to_float(float_to_bf16(f)), f, std::abs(f) * 4e-3);
  }
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)), 1.0f);  // ties to even
  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);  // rounds to inf
  Tensor t = Tensor::empty({3}, DType::F32);
  t.data<float>()[0] = 1.5f; t.data<float>()[1] = -3.0f; t.data<float>()[2] = 0.1f;
  Tensor b = t.to(DType::BF16).to(DType::F32);
  EXPECT_EQ(b.data<float>()[0], 1.5f);
  EXPECT_NEAR(b.data<float>()[2], 0.1f, 1e-3);
}

TEST(Rng, PhiloxIsCounterBasedAndNormalish) {
  Philox r(42, 7);
  EXPECT_EQ(r.block(5), Philox(42, 7).block(5));
  EXPECT_NE(r.block(5), Philox(43, 7).block(5));
  EXPECT_NE(r.block(5), Philox(42, 8).block(5));
  // Known-answer test from the Random123 paper's kat_vectors: philox4x32_10, all-zero inputs.
  auto z = Philox(0, 0).block(0);
  EXPECT_EQ(z[0], 0x6627e8d5u);
  EXPECT_EQ(z[1], 0xe169c58du);
  EXPECT_EQ(z[2], 0xbc57ac4cu);
  EXPECT_EQ(z[3], 0x9b00dbd8u);
  std::vector<float> v(100000);
  fill_normal(v.data(), v.size(), r, 0.0f, 1.0f);
  double m = 0, s = 0;
  for (float x : v) m += x;
  m /= v.size();
  for (float x : v) s += (x - m) * (x - m);
  s = std::sqrt(s / v.size());
  EXPECT_NEAR(m, 0.0, 0.02);
  EXPECT_NEAR(s, 1.0, 0.02);
}

TEST(Tensor, SizesThatOverflowAreErrorsNamingTheTensor) {
  const int64_t big = int64_t{1} << 40;
  EXPECT_ERROR_CONTAINS(Tensor::empty({big, big}, DType::F32, MemCategory::Other, "huge"), "shape [", "overflows int64");
  // numel fits, bytes do not.
  EXPECT_ERROR_CONTAINS(Tensor::empty({int64_t{1} << 62}, DType::F32, MemCategory::Other, "wide"), "tensor 'wide'",
                        "overflows int64");
}
