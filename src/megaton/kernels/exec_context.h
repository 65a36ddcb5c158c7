// What a kernel call runs on: the device (which backend: kernels::cpu or kernels::cuda) and, on
// CUDA, the stream. Kernels take tensors, check that every tensor is on this device and has a
// dtype the op supports, and dispatch.
#pragma once
#include <initializer_list>
#include <string_view>

#include "megaton/core/device.h"
#include "megaton/core/tensor.h"

namespace megaton::kernels {

struct ExecContext {
  Device device = Device::cpu();
  void* stream = nullptr;  // cudaStream_t on CUDA (null: the default stream); unused on the cpu

  static ExecContext on(const Tensor& t) { return {t.device(), nullptr}; }
};

// Throws megaton::Error naming the op and the first tensor that is undefined, lives on another
// device than ctx, or (for expect_dtype) holds another dtype than `dtype`.
void expect_on_device(const ExecContext& ctx, std::string_view op, std::initializer_list<const Tensor*> tensors);
void expect_dtype(DType dtype, std::string_view op, std::initializer_list<const Tensor*> tensors);
// Throws naming the op and the tensor unless t has numel() == rows * cols (any leading shape).
void expect_matrix(std::string_view op, const Tensor& t, int64_t rows, int64_t cols);

// The data of an optional tensor (a bias, a position table): null when it is undefined.
template <typename T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// Calls f(float{}) or f(double{}) for an f32 / f64 dtype, the element types of the CPU reference
// kernels; throws naming the op for any other dtype.
template <typename F>
void dispatch_cpu_float(DType dtype, std::string_view op, F&& f) {
  if (dtype == DType::F32) return f(float{});
  if (dtype == DType::F64) return f(double{});
  fail("kernel ", op, " on cpu does not support dtype ", dtype_name(dtype));
}

// The op on a CUDA tensor in a build without CUDA, or with an op the CUDA backend lacks.
[[noreturn]] void fail_no_backend(const ExecContext& ctx, std::string_view op);

}  // namespace megaton::kernels
