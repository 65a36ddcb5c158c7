#include "megaton/kernels/linear.h"

#include <type_traits>

#include "megaton/kernels/cpu/linear.h"
#include "megaton/kernels/linear_shape.h"
#ifdef MEGATON_WITH_CUDA
#include "megaton/kernels/cuda/linear.h"
#endif

namespace megaton::kernels {

LinearShape check_linear(std::string_view op, const Tensor& w, const Tensor& x, const Tensor& y, const Tensor* bias) {
  if (w.dim() != 2) fail("kernel ", op, ": weight '", w.name(), "' has shape ", shape_str(w.shape()), ", expected 2-D");
  const int64_t out = w.size(0), in = w.size(1);
  if (x.dim() == 0 || x.size(-1) != in)
    fail("kernel ", op, ": input '", x.name(), "' has shape ", shape_str(x.shape()), ", expected [..., ", in, "]");
  const int64_t rows = x.numel() / in;
  expect_matrix(op, y, rows, out);
  if (bias && bias->defined()) expect_matrix(op, *bias, 1, out);
  return {rows, in, out};
}

void linear_forward(const ExecContext& ctx, const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias) {
  constexpr std::string_view op = "linear_forward";
  expect_on_device(ctx, op, {&out, &x, &w});
  if (bias.defined()) expect_on_device(ctx, op, {&bias});
  const LinearShape s = check_linear(op, w, x, out, &bias);
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::linear_forward(ctx, out, x, w, bias, s.rows, s.in, s.out);
#endif
    fail_no_backend(ctx, op);
  }
  expect_dtype(w.dtype(), op, {&out, &x});
  dispatch_cpu_io(w.dtype(), op, [&]<typename T>(T) {
    const auto run = [&]<typename B>(B) {
      cpu::linear_forward(out.data<T>(), x.data<T>(), w.data<T>(), data_or_null<B>(bias), s.rows, s.in, s.out);
    };
    if (bias.defined()) return dispatch_cpu_param<T>(op, bias, run);
    run(T{});
  });
}

void linear_backward_input(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& w) {
  constexpr std::string_view op = "linear_backward_input";
  expect_on_device(ctx, op, {&dx, &dout, &w});
  const LinearShape s = check_linear(op, w, dx, dout, nullptr);
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::linear_backward_input(ctx, dx, dout, w, s.rows, s.in, s.out);
#endif
    fail_no_backend(ctx, op);
  }
  expect_dtype(w.dtype(), op, {&dx, &dout});
  dispatch_cpu_io(w.dtype(), op, [&]<typename T>(T) {
    cpu::linear_backward_input(dx.data<T>(), dout.data<T>(), w.data<T>(), s.rows, s.in, s.out);
  });
}

void linear_backward_weight(const ExecContext& ctx, const Tensor& dw, const Tensor& dbias, const Tensor& dout,
                            const Tensor& x) {
  constexpr std::string_view op = "linear_backward_weight";
  expect_on_device(ctx, op, {&dw, &dout, &x});
  if (dbias.defined()) expect_on_device(ctx, op, {&dbias});
  const LinearShape s = check_linear(op, dw, x, dout, &dbias);
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::linear_backward_weight(ctx, dw, dbias, dout, x, s.rows, s.in, s.out);
#endif
    fail_no_backend(ctx, op);
  }
  expect_dtype(x.dtype(), op, {&dout});
  dispatch_cpu_io(x.dtype(), op, [&]<typename T>(T) {
    // The gradients of bf16 / fp16 inputs accumulate into an fp32 main grad on the cpu (a bf16 dw
    // would round every micro-batch's sum to 8 bits of mantissa).
    using G = std::conditional_t<is_half_v<T>, float, T>;
    expect_dtype(dtype_of<G>(), op, {&dw});
    if (dbias.defined()) expect_dtype(dtype_of<G>(), op, {&dbias});
    cpu::linear_backward_weight(dw.data<G>(), data_or_null<G>(dbias), dout.data<T>(), x.data<T>(), s.rows, s.in,
                                s.out);
  });
}

void bias_backward(const ExecContext& ctx, const Tensor& dbias, const Tensor& dout) {
  constexpr std::string_view op = "bias_backward";
  expect_on_device(ctx, op, {&dbias, &dout});
  MEGATON_CHECK(ctx.device.is_cpu(), "kernel ", op, " has no ", ctx.device.str(), " backend yet");
  MEGATON_CHECK(dbias.dim() == 1 && dout.dim() >= 1 && dout.size(-1) == dbias.size(0), "kernel ", op, ": bias gradient '",
                dbias.name(), "' ", shape_str(dbias.shape()), " does not match output gradient '", dout.name(), "' ",
                shape_str(dout.shape()));
  const int64_t C = dbias.size(0), N = C == 0 ? 0 : dout.numel() / C;
  dispatch_cpu_io(dout.dtype(), op, [&]<typename T>(T) {
    using G = std::conditional_t<is_half_v<T>, float, T>;
    expect_dtype(dtype_of<G>(), op, {&dbias});
    cpu::bias_backward(dbias.data<G>(), dout.data<T>(), N, C);
  });
}

}  // namespace megaton::kernels
