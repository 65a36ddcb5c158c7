// Small f32 host tensors for kernel tests of the tensor API: from a vector, back to a vector, zeros.
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

}  // namespace megaton::testing
