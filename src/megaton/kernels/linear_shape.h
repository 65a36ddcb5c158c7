// The shape check every linear kernel starts with (kernels/linear.cpp, kernels/quantized_linear.cpp).
#pragma once
#include <string_view>

#include "megaton/core/tensor.h"

namespace megaton::kernels {

struct LinearShape {
  int64_t rows, in, out;
};

// Checks w [out, in], x [rows, in], y [rows, out] (and the bias [out]) and returns the sizes,
// naming the op and the tensor that does not fit.
LinearShape check_linear(std::string_view op, const Tensor& w, const Tensor& x, const Tensor& y, const Tensor* bias);

}  // namespace megaton::kernels
