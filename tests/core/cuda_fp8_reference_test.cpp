// Our FP8 conversions against NVIDIA's own host conversions (cuda_fp8.h, compiled here as plain C++:
// the header's __host__ paths need no GPU): every fp16 and bf16 input, 10^7 random fp32 bit patterns
// and every code's decoded value, for both formats and both overflow rules. Skips visibly when the
// CUDA headers are absent.
#include <gtest/gtest.h>

#include "megaton/core/dtype.h"
#include "megaton/core/fp8_format.h"

#ifdef MEGATON_HAVE_CUDA_FP8_H
#include <cuda_fp8.h>

#include <cmath>
#include <cstring>
#include <random>
#endif

namespace megaton::fp8 {
namespace {

#ifdef MEGATON_HAVE_CUDA_FP8_H

__nv_fp8_interpretation_t nv(Format f) { return f == Format::E4M3 ? __NV_E4M3 : __NV_E5M2; }
__nv_saturation_t nv(Overflow o) { return o == Overflow::Saturate ? __NV_SATFINITE : __NV_NOSAT; }

constexpr Format kFormats[] = {Format::E4M3, Format::E5M2};
constexpr Overflow kRules[] = {Overflow::Saturate, Overflow::NonFinite};

// Every 16-bit pattern of a half or bf16 input: ours(bits) (our encode of its float value) against
// theirs(bits, overflow, format) (CUDA's conversion of the raw 16 bits).
template <typename Ours, typename Theirs>
void expect_every_16_bit_input(const char* kind, Ours ours, Theirs theirs) {
  for (Format f : kFormats)
    for (Overflow o : kRules) {
      int64_t mismatches = 0;
      for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
        const uint8_t a = encode(ours(static_cast<uint16_t>(bits)), f, o);
        const uint8_t b = theirs(static_cast<unsigned short>(bits), nv(o), nv(f));
        if (a != b && mismatches++ < 5)
          ADD_FAILURE() << info(f).name << " " << kind << " 0x" << std::hex << bits << ": ours 0x" << int(a) << ", cuda 0x"
                        << int(b);
      }
      EXPECT_EQ(mismatches, 0) << info(f).name << " " << kind;
    }
}

TEST(CudaFp8Reference, EveryHalfInput) {
  expect_every_16_bit_input("half", f16_to_float, [](unsigned short bits, __nv_saturation_t o, __nv_fp8_interpretation_t f) {
    __half_raw h;
    h.x = bits;
    return __nv_cvt_halfraw_to_fp8(h, o, f);
  });
}

TEST(CudaFp8Reference, EveryBf16Input) {
  expect_every_16_bit_input("bf16", bf16_to_float, [](unsigned short bits, __nv_saturation_t o, __nv_fp8_interpretation_t f) {
    __nv_bfloat16_raw b;
    b.x = bits;
    return __nv_cvt_bfloat16raw_to_fp8(b, o, f);
  });
}

TEST(CudaFp8Reference, TenMillionRandomFloats) {
  std::mt19937 gen(20261201);
  int64_t mismatches = 0;
  for (int i = 0; i < 10'000'000; ++i) {
    // Half the draws are uniform bit patterns (every exponent, NaNs, infs), half are values inside
    // the FP8 ranges, where rounding decides.
    uint32_t bits = gen();
    if (i & 1) bits = (bits & 0x807fffffu) | ((100u + (bits >> 23) % 60u) << 23);
    float x;
    std::memcpy(&x, &bits, sizeof x);
    for (Format f : kFormats)
      for (Overflow o : kRules) {
        const uint8_t ours = encode(x, f, o), theirs = __nv_cvt_float_to_fp8(x, nv(o), nv(f));
        if (ours != theirs && mismatches++ < 5)
          ADD_FAILURE() << info(f).name << " float 0x" << std::hex << bits << ": ours 0x" << int(ours) << ", cuda 0x"
                        << int(theirs);
      }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(CudaFp8Reference, EveryCodeDecodes) {
  for (Format f : kFormats)
    for (uint32_t c = 0; c < 256; ++c) {
      const float ours = decode(static_cast<uint8_t>(c), f);
      const float theirs = f16_to_float(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(c), nv(f)).x);
      if (std::isnan(theirs)) EXPECT_TRUE(std::isnan(ours)) << info(f).name << " code " << c;
      else EXPECT_EQ(ours, theirs) << info(f).name << " code " << c;
    }
}

#else

TEST(CudaFp8Reference, SkippedWithoutCudaHeaders) { GTEST_SKIP() << "skipped: cuda_fp8.h not found"; }

#endif

}  // namespace
}  // namespace megaton::fp8
