// What a kernel call runs on: the device (which backend: kernels::cpu or kernels::cuda) and, on
// CUDA, the stream. Kernels take tensors, check that every tensor is on this device and has a
// dtype the op supports, and dispatch.
#pragma once
#include <initializer_list>
#include <string_view>
#include <type_traits>

#include "megaton/core/checked.h"
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

// One level of a strided access: `count` items, `stride` elements apart.
struct Strided {
  int64_t count, stride;
};
// Throws naming the op and the tensor unless t holds every element of a strided access: `len`
// contiguous elements at offset + sum_i k_i * levels[i].stride for every 0 <= k_i < levels[i].count
// (no element when a count or len is 0). Negative arguments are errors; the extent is computed
// with overflow checks, so huge strides fail here instead of wrapping around.
void expect_holds(std::string_view op, const Tensor& t, int64_t offset, std::initializer_list<Strided> levels,
                  int64_t len);

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

// dispatch_cpu_float plus f(BFloat16{}) for bf16: the activation types of the CPU kernels that take
// bf16 (linear, norms, activations; computed in fp32).
template <typename F>
void dispatch_cpu_io(DType dtype, std::string_view op, F&& f) {
  if (dtype == DType::BF16) return f(BFloat16{});
  if (dtype == DType::F16) return f(Float16{});
  dispatch_cpu_float(dtype, op, f);
}

// Calls f(P{}) for the type P of a parameter-side tensor p (a weight, a bias, their gradients) of a
// CPU kernel whose activations are T: T itself for f32 / f64; f32 or bf16 next to bf16 activations
// (an fp32 master copy or a bf16 copy of the weights; an fp32 main grad or a bf16 gradient).
template <typename T, typename F>
void dispatch_cpu_param(std::string_view op, const Tensor& p, F&& f) {
  if constexpr (is_half_v<T>) {
    if (p.dtype() == DType::F32) return f(float{});
    if (p.dtype() == dtype_of<T>()) return f(T{});
    const auto half = dtype_name(dtype_of<T>());
    fail("kernel ", op, ": tensor '", p.name(), "' holds ", dtype_name(p.dtype()), ", expected f32 or ", half, " next to ",
         half, " activations");
  } else {
    expect_dtype(dtype_of<T>(), op, {&p});
    f(T{});
  }
}

// The op on a CUDA tensor in a build without CUDA, or with an op the CUDA backend lacks.
[[noreturn]] void fail_no_backend(const ExecContext& ctx, std::string_view op);

}  // namespace megaton::kernels
