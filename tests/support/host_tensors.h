// Small f32 host tensors for kernel tests of the tensor API: from a vector, back to a vector, zeros,
// the transpose of a matrix.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "megaton/core/tensor.h"

namespace megaton::testing {

inline Tensor tensor_of(const std::vector<float>& v, Shape shape, const std::string& name) {
  Tensor t = Tensor::empty(std::move(shape), DType::F32, MemCategory::Other, name);
  EXPECT_EQ(static_cast<size_t>(t.numel()), v.size());
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

inline std::vector<float> values(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.numel()}; }

inline Tensor zeros(Shape shape, const std::string& name, DType dtype = DType::F32) {
  return Tensor::zeros(std::move(shape), dtype, MemCategory::Other, name);
}

// A new f32 [cols, rows] tensor holding the f32 matrix x [rows, cols] transposed.
inline Tensor transposed(const Tensor& x) {
  const int64_t rows = x.size(0), cols = x.size(1);
  Tensor t = Tensor::empty({cols, rows}, DType::F32, MemCategory::Other, x.name() + "_t");
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t.data<float>()[c * rows + r] = x.data<float>()[r * cols + c];
  return t;
}

}  // namespace megaton::testing
