// Windows and row slices: views at an offset into shared storage.
#include <gtest/gtest.h>

#include "../support/temp_dir.h"
#include "megaton/core/tensor.h"

using namespace megaton;

TEST(TensorView, WindowSharesStorageAtItsOffset) {
  Tensor t = Tensor::zeros({4, 5}, DType::F32, MemCategory::Other, "buf");
  Tensor w = t.window(7, {2, 3}, "w");
  EXPECT_TRUE(w.shares_storage_with(t));
  EXPECT_EQ(w.storage_offset(), 7);
  EXPECT_EQ(w.numel(), 6);
  EXPECT_EQ(w.nbytes(), 24u);
  EXPECT_EQ(w.name(), "w");
  w.data<float>()[0] = 1.0f;
  w.data<float>()[5] = 2.0f;
  EXPECT_EQ(t.data<float>()[7], 1.0f);
  EXPECT_EQ(t.data<float>()[12], 2.0f);
  w.zero_();  // touches only the window
  t.data<float>()[6] = 3.0f;
  t.data<float>()[13] = 4.0f;
  w.zero_();
  EXPECT_EQ(t.data<float>()[6], 3.0f);
  EXPECT_EQ(t.data<float>()[13], 4.0f);
  // A window of a window adds the offsets; clone copies only the window's bytes.
  Tensor ww = w.window(2, {3}, "ww");
  EXPECT_EQ(ww.storage_offset(), 9);
  t.data<float>()[9] = 5.0f;
  Tensor c = ww.clone(MemCategory::Other);
  EXPECT_FALSE(c.shares_storage_with(t));
  EXPECT_EQ(c.storage_offset(), 0);
  EXPECT_EQ(c.data<float>()[0], 5.0f);
}

TEST(TensorView, WindowOutsideTheTensorIsAnErrorNamingIt) {
  Tensor t = Tensor::zeros({10}, DType::F32, MemCategory::Other, "buf");
  EXPECT_NO_THROW(t.window(10, {0}, "empty at end"));
  EXPECT_THROW(t.window(8, {3}, "w"), Error);
  EXPECT_THROW(t.window(-1, {1}, "w"), Error);
  EXPECT_THROW(t.window(11, {0}, "w"), Error);
  Tensor w = t.window(2, {4}, "w");
  EXPECT_ERROR_CONTAINS(w.window(1, {4}, "ww"), "'w'");
}

TEST(TensorView, SliceRowsSelectsContiguousRows) {
  Tensor t = Tensor::empty({5, 3}, DType::I32, MemCategory::Other, "rows");
  for (int i = 0; i < 15; ++i) t.data<int32_t>()[i] = i;
  Tensor s = t.slice_rows(1, 4);
  EXPECT_EQ(s.shape(), (Shape{3, 3}));
  EXPECT_EQ(s.data<int32_t>()[0], 3);
  EXPECT_EQ(s.data<int32_t>()[8], 11);
  Tensor s2 = s.slice_rows(2, 3);  // a slice of a slice
  EXPECT_EQ(s2.data<int32_t>()[0], 9);
  EXPECT_EQ(t.slice_rows(5, 5).numel(), 0);
  EXPECT_THROW(t.slice_rows(3, 2), Error);
  EXPECT_THROW(t.slice_rows(0, 6), Error);
}

TEST(TensorView, ConvertingCopyIntoAWindowLeavesTheRestAlone) {
  Tensor t = Tensor::zeros({6}, DType::F32, MemCategory::Other, "buf");
  Tensor src = Tensor::empty({2}, DType::F64, MemCategory::Other, "src");
  src.data<double>()[0] = 1.5;
  src.data<double>()[1] = -2.5;
  t.window(3, {2}, "w").copy_from(src);
  EXPECT_EQ(std::vector<float>(t.data<float>(), t.data<float>() + 6), (std::vector<float>{0, 0, 0, 1.5f, -2.5f, 0}));
}
