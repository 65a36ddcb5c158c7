#include "megaton/kernels/activation.h"

#include "megaton/kernels/cpu/activation.h"
#ifdef MEGATON_WITH_CUDA
#include "megaton/kernels/cuda/activation.h"
#endif

namespace megaton::kernels {

namespace {

// Every tensor on the call's device with x's element count (and, on the cpu, its dtype).
void check_pointwise(const ExecContext& ctx, std::string_view op, const Tensor& x,
                     std::initializer_list<const Tensor*> others) {
  expect_on_device(ctx, op, {&x});
  expect_on_device(ctx, op, others);
  for (const Tensor* t : others)
    if (t->numel() != x.numel())
      fail("kernel ", op, ": tensor '", t->name(), "' has shape ", shape_str(t->shape()), ", expected the ",
           x.numel(), " elements of '", x.name(), "'");
  if (ctx.device.is_cpu()) expect_dtype(x.dtype(), op, others);
}

// gu [N, 2H] and the [N, H] tensors of a SwiGLU call; returns {N, H}.
std::pair<int64_t, int64_t> check_swiglu(const ExecContext& ctx, std::string_view op, const Tensor& gu,
                                         std::initializer_list<const Tensor*> halves) {
  expect_on_device(ctx, op, {&gu});
  expect_on_device(ctx, op, halves);
  if (gu.dim() == 0 || gu.size(-1) % 2 != 0)
    fail("kernel ", op, ": input '", gu.name(), "' has shape ", shape_str(gu.shape()),
         ", expected [..., 2H] ([gate | up])");
  const int64_t H = gu.size(-1) / 2, N = gu.numel() / gu.size(-1);
  for (const Tensor* t : halves) expect_matrix(op, *t, N, H);
  if (ctx.device.is_cpu()) expect_dtype(gu.dtype(), op, halves);
  return {N, H};
}

// The [F] bias (and dbias) of a fused bias + activation on h [N, F]: on the call's device, in
// compute_t of h's dtype (f64 for f64, else f32).
void check_bias(const ExecContext& ctx, std::string_view op, const Tensor& h, std::initializer_list<const Tensor*> biases) {
  expect_on_device(ctx, op, biases);
  const int64_t F = h.size(-1);
  for (const Tensor* b : biases) expect_matrix(op, *b, 1, F);
  expect_dtype(h.dtype() == DType::F64 ? DType::F64 : DType::F32, op, biases);
}

}  // namespace

void bias_gelu_forward(const ExecContext& ctx, const Tensor& out, const Tensor& h, const Tensor& bias) {
  constexpr std::string_view op = "bias_gelu_forward";
  check_pointwise(ctx, op, h, {&out});
  check_bias(ctx, op, h, {&bias});
  const int64_t F = h.size(-1);
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::bias_gelu_forward(ctx, out, h, bias, F);
#endif
    fail_no_backend(ctx, op);
  }
  dispatch_cpu_io(h.dtype(), op, [&]<typename T>(T) {
    cpu::bias_gelu_forward(out.data<T>(), h.data<T>(), bias.data<cpu::compute_t<T>>(), h.numel() / F, F);
  });
}

void bias_gelu_backward(const ExecContext& ctx, const Tensor& dh, const Tensor& dbias, const Tensor& dout,
                        const Tensor& h, const Tensor& bias) {
  constexpr std::string_view op = "bias_gelu_backward";
  check_pointwise(ctx, op, h, {&dh, &dout});
  check_bias(ctx, op, h, {&dbias, &bias});
  const int64_t F = h.size(-1);
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::bias_gelu_backward(ctx, dh, dbias, dout, h, bias, F);
#endif
    fail_no_backend(ctx, op);
  }
  dispatch_cpu_io(h.dtype(), op, [&]<typename T>(T) {
    using C = cpu::compute_t<T>;
    cpu::bias_gelu_backward(dh.data<T>(), dbias.data<C>(), dout.data<T>(), h.data<T>(), bias.data<C>(),
                            h.numel() / F, F);
  });
}

void bias_swiglu_forward(const ExecContext& ctx, const Tensor& out, const Tensor& gu, const Tensor& bias) {
  constexpr std::string_view op = "bias_swiglu_forward";
  const auto [N, H] = check_swiglu(ctx, op, gu, {&out});
  check_bias(ctx, op, gu, {&bias});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::bias_swiglu_forward(ctx, out, gu, bias, N, H);
#endif
    fail_no_backend(ctx, op);
  }
  dispatch_cpu_io(gu.dtype(), op, [&, N = N, H = H]<typename T>(T) {
    cpu::bias_swiglu_forward(out.data<T>(), gu.data<T>(), bias.data<cpu::compute_t<T>>(), N, H);
  });
}

void bias_swiglu_backward(const ExecContext& ctx, const Tensor& dgu, const Tensor& dbias, const Tensor& dout,
                          const Tensor& gu, const Tensor& bias) {
  constexpr std::string_view op = "bias_swiglu_backward";
  const auto [N, H] = check_swiglu(ctx, op, gu, {&dout});
  check_pointwise(ctx, op, gu, {&dgu});
  check_bias(ctx, op, gu, {&dbias, &bias});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::bias_swiglu_backward(ctx, dgu, dbias, dout, gu, bias, N, H);
#endif
    fail_no_backend(ctx, op);
  }
  dispatch_cpu_io(gu.dtype(), op, [&, N = N, H = H]<typename T>(T) {
    using C = cpu::compute_t<T>;
    cpu::bias_swiglu_backward(dgu.data<T>(), dbias.data<C>(), dout.data<T>(), gu.data<T>(), bias.data<C>(), N, H);
  });
}

void gelu_forward(const ExecContext& ctx, const Tensor& out, const Tensor& x) {
  constexpr std::string_view op = "gelu_forward";
  check_pointwise(ctx, op, x, {&out});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::gelu_forward(ctx, out, x);
#endif
    fail_no_backend(ctx, op);
  }
  dispatch_cpu_io(x.dtype(), op, [&]<typename T>(T) { cpu::gelu_forward(out.data<T>(), x.data<T>(), x.numel()); });
}

void gelu_backward(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x) {
  constexpr std::string_view op = "gelu_backward";
  check_pointwise(ctx, op, x, {&dx, &dout});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::gelu_backward(ctx, dx, dout, x);
#endif
    fail_no_backend(ctx, op);
  }
  dispatch_cpu_io(x.dtype(), op, [&]<typename T>(T) {
    cpu::gelu_backward(dx.data<T>(), dout.data<T>(), x.data<T>(), x.numel());
  });
}

void swiglu_forward(const ExecContext& ctx, const Tensor& out, const Tensor& gu) {
  constexpr std::string_view op = "swiglu_forward";
  const auto [N, H] = check_swiglu(ctx, op, gu, {&out});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::swiglu_forward(ctx, out, gu, N, H);
#endif
    fail_no_backend(ctx, op);
  }
  // Bindings copied into the lambda: clang 14 (the fuzzing build) cannot capture structured bindings.
  dispatch_cpu_io(gu.dtype(), op, [&, N = N, H = H]<typename T>(T) {
    cpu::swiglu_forward(out.data<T>(), gu.data<T>(), N, H);
  });
}

void swiglu_backward(const ExecContext& ctx, const Tensor& dgu, const Tensor& dout, const Tensor& gu) {
  constexpr std::string_view op = "swiglu_backward";
  const auto [N, H] = check_swiglu(ctx, op, gu, {&dout});
  expect_on_device(ctx, op, {&dgu});
  expect_matrix(op, dgu, N, 2 * H);
  expect_dtype(gu.dtype(), op, {&dgu});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::swiglu_backward(ctx, dgu, dout, gu, N, H);
#endif
    fail_no_backend(ctx, op);
  }
  dispatch_cpu_io(gu.dtype(), op, [&, N = N, H = H]<typename T>(T) {
    cpu::swiglu_backward(dgu.data<T>(), dout.data<T>(), gu.data<T>(), N, H);
  });
}

void residual_forward(const ExecContext& ctx, const Tensor& out, const Tensor& a, const Tensor& b) {
  constexpr std::string_view op = "residual_forward";
  check_pointwise(ctx, op, a, {&out, &b});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::residual_forward(ctx, out, a, b);
#endif
    fail_no_backend(ctx, op);
  }
  dispatch_cpu_io(a.dtype(), op, [&]<typename T>(T) {
    cpu::residual_forward(out.data<T>(), a.data<T>(), b.data<T>(), a.numel());
  });
}

}  // namespace megaton::kernels
