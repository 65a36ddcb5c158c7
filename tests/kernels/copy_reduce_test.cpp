// Strided block copies and whole-tensor reductions against loops written out here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "../support/temp_dir.h"
#include "finite_diff.h"
#include "megaton/kernels/copy.h"
#include "megaton/kernels/reduce.h"

using namespace megaton;

namespace {
const kernels::ExecContext cpu;

Tensor iota(Shape shape, DType dtype, double start, const std::string& name) {
  Tensor t = Tensor::empty(std::move(shape), DType::F64, MemCategory::Other, name);
  std::iota(t.data<double>(), t.data<double>() + t.numel(), start);
  Tensor out = t.to(dtype);
  out.set_name(name);
  return out;
}

Tensor ids(std::vector<int32_t> v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::I32, MemCategory::Other, "ids");
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}
}  // namespace

// The KV-cache append: columns [3, 5) of rows 0..1 of every batch row land at rows 4..5 of the cache.
TEST(CopyRows, CopiesABlockPerBatchRowAndNothingElse) {
  const int64_t B = 3;
  Tensor src = iota({B, 2, 7}, DType::F32, 1, "qkv");
  Tensor dst = Tensor::zeros({B, 6, 2}, DType::F32, MemCategory::Other, "cache");
  kernels::copy_rows(cpu, {dst, 4, 0}, {src, 0, 3}, 2, 2);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < 6; ++r)
      for (int64_t c = 0; c < 2; ++c) {
        const float want = r >= 4 ? src.data<float>()[(b * 2 + r - 4) * 7 + 3 + c] : 0.0f;
        ASSERT_EQ(dst.data<float>()[(b * 6 + r) * 2 + c], want) << "b " << b << " r " << r << " c " << c;
      }
}

TEST(CopyRows, BlocksThatDoNotFitAreErrorsNamingTheTensor) {
  Tensor src = iota({2, 3, 4}, DType::F32, 0, "src");
  Tensor dst = Tensor::zeros({2, 3, 4}, DType::F32, MemCategory::Other, "dst");
  Tensor other_b = Tensor::zeros({3, 3, 4}, DType::F32, MemCategory::Other, "other_b");
  Tensor f64 = Tensor::zeros({2, 3, 4}, DType::F64, MemCategory::Other, "f64");
  EXPECT_NO_THROW(kernels::copy_rows(cpu, {dst, 0, 0}, {src, 0, 0}, 3, 4));
  EXPECT_THROW(kernels::copy_rows(cpu, {dst, 1, 0}, {src, 0, 0}, 3, 4), Error);   // past dst's rows
  EXPECT_THROW(kernels::copy_rows(cpu, {dst, 0, 0}, {src, 0, 1}, 3, 4), Error);   // past src's columns
  EXPECT_THROW(kernels::copy_rows(cpu, {dst, -1, 0}, {src, 0, 0}, 1, 1), Error);  // negative corner
  EXPECT_THROW(kernels::copy_rows(cpu, {other_b, 0, 0}, {src, 0, 0}, 1, 1), Error);
  EXPECT_THROW(kernels::copy_rows(cpu, {f64, 0, 0}, {src, 0, 0}, 1, 1), Error);
  EXPECT_ERROR_CONTAINS(kernels::copy_rows(cpu, {dst, 2, 0}, {src, 0, 0}, 2, 4), "'dst'");
}

// Large enough for several chunks and threads; same bits with 1 and 2 threads.
TEST(Reduce, SumMatchesALongDoubleLoopAndIgnoresTheThreadCount) {
  const auto v = fd::random_vector<float>(100003, 3, -1.0, 1.0);
  Tensor x = Tensor::empty({static_cast<int64_t>(v.size())}, DType::F32, MemCategory::Other, "x");
  std::copy(v.begin(), v.end(), x.data<float>());
  long double want = 0;
  for (float f : v) want += f;
  double one = 0, two = 0;
  fd::with_threads(1, [&] { one = kernels::sum(cpu, x); });
  fd::with_threads(2, [&] { two = kernels::sum(cpu, x); });
  EXPECT_NEAR(one, static_cast<double>(want), 1e-9);
  EXPECT_EQ(std::memcmp(&one, &two, sizeof one), 0);
  EXPECT_EQ(kernels::sum(cpu, x.slice_rows(5, 5)), 0.0);
  Tensor i32 = ids({1, 2});
  EXPECT_THROW(kernels::sum(cpu, i32), Error);
}

TEST(Reduce, CountsAndFindsTheFirstIdOutOfRange) {
  Tensor t = ids({3, -100, 7, 0, -100, 9, 2});
  EXPECT_EQ(kernels::count_not_equal(cpu, t, -100), 5);
  EXPECT_EQ(kernels::first_out_of_range(cpu, t, 10, -100), -1);
  EXPECT_EQ(kernels::first_out_of_range(cpu, t, 10), 1);     // -100 is out of range without `ignore`
  EXPECT_EQ(kernels::first_out_of_range(cpu, t, 9, -100), 5);  // 9 >= limit
  EXPECT_EQ(kernels::first_out_of_range(cpu, t, 3, -100), 0);
  // The first offending index, also when it sits in a later chunk of a long tensor.
  std::vector<int32_t> many(200000, 1);
  many[150001] = 5;
  many[170000] = -2;
  EXPECT_EQ(kernels::first_out_of_range(cpu, ids(many), 5), 150001);
  EXPECT_EQ(kernels::count_not_equal(cpu, ids(many), 1), 2);
}

// FP8 delayed scaling's calibration amax: the largest magnitude, in every dtype the linears read,
// wherever it sits among several chunks and threads; a NaN anywhere is reported, never dropped.
TEST(Reduce, AbsMaxFindsTheLargestMagnitudeAndReportsNaN) {
  std::vector<float> v = fd::random_vector<float>(200003, 5, -1.0, 1.0);
  v[170001] = -3.5f;  // in a later chunk, negative
  for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    Tensor f = Tensor::empty({static_cast<int64_t>(v.size())}, DType::F32, MemCategory::Other, "x");
    std::copy(v.begin(), v.end(), f.data<float>());
    Tensor x = f.to(dtype);
    float one = 0, two = 0;
    fd::with_threads(1, [&] { one = kernels::abs_max(cpu, x); });
    fd::with_threads(2, [&] { two = kernels::abs_max(cpu, x); });
    EXPECT_EQ(one, 3.5f) << dtype_name(dtype);
    EXPECT_EQ(two, 3.5f) << dtype_name(dtype);
    EXPECT_EQ(kernels::abs_max(cpu, x.slice_rows(5, 5)), 0.0f);
  }
  for (size_t at : {size_t{0}, size_t{100000}, v.size() - 1}) {
    std::vector<float> w = v;
    w[at] = std::numeric_limits<float>::quiet_NaN();
    Tensor x = Tensor::empty({static_cast<int64_t>(w.size())}, DType::F32, MemCategory::Other, "x");
    std::copy(w.begin(), w.end(), x.data<float>());
    fd::with_threads(2, [&] { EXPECT_TRUE(std::isnan(kernels::abs_max(cpu, x))) << at; });
  }
  EXPECT_THROW(kernels::abs_max(cpu, ids({1, 2})), Error);
}

// Multi-latent attention's shared rope key: broadcast_rows copies one row block into `copies` rows
// of every batch row, sum_rows is its adjoint (<broadcast(x), y> = <x, sum(y)> for all x, y), and
// neither touches anything outside its block.
TEST(SharedRows, BroadcastCopiesAndSumRowsIsItsAdjoint) {
  const int64_t B = 5, H = 3, W = 9, R = 7, cols = 4;
  for (DType dtype : {DType::F32, DType::F64}) {
    Tensor x = iota({B, 1, R}, dtype, 1, "latent");
    Tensor wide = Tensor::zeros({B, H + 1, W}, dtype, MemCategory::Other, "keys");
    kernels::broadcast_rows(cpu, {wide, 1, 2}, {x, 0, 3}, H, cols);
    Tensor w64 = wide.to(DType::F64), x64 = x.to(DType::F64);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t r = 0; r < H + 1; ++r)
        for (int64_t c = 0; c < W; ++c) {
          const bool inside = r >= 1 && c >= 2 && c < 2 + cols;
          const double want = inside ? x64.data<double>()[b * R + 3 + c - 2] : 0.0;
          ASSERT_EQ(w64.data<double>()[(b * (H + 1) + r) * W + c], want) << b << " " << r << " " << c;
        }
    Tensor y = iota({B, H + 1, W}, dtype, -20, "dkeys");
    Tensor dx = Tensor::zeros({B, 1, R}, dtype, MemCategory::Other, "dlatent");
    kernels::sum_rows(cpu, {dx, 0, 3}, {y, 1, 2}, H, cols);
    const Tensor y64 = y.to(DType::F64), dx64 = dx.to(DType::F64);
    double lhs = 0, rhs = 0;
    for (int64_t i = 0; i < w64.numel(); ++i) lhs += w64.data<double>()[i] * y64.data<double>()[i];
    for (int64_t i = 0; i < x64.numel(); ++i) rhs += x64.data<double>()[i] * dx64.data<double>()[i];
    EXPECT_EQ(lhs, rhs);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < R; ++c)
        if (c < 3) {
          EXPECT_EQ(dx64.data<double>()[b * R + c], 0.0) << "written outside the block";
        }
  }
  Tensor x = iota({2, 1, 4}, DType::F32, 1, "one");
  Tensor small = Tensor::zeros({3, 2, 4}, DType::F32, MemCategory::Other, "small");
  EXPECT_THROW(kernels::broadcast_rows(cpu, {small, 0, 0}, {x, 0, 0}, 2, 4), Error);  // batch rows differ
  Tensor narrow = Tensor::zeros({2, 2, 4}, DType::F32, MemCategory::Other, "narrow");
  EXPECT_THROW(kernels::sum_rows(cpu, {x, 0, 0}, {narrow, 0, 0}, 3, 4), Error);  // 3 rows do not fit
}
