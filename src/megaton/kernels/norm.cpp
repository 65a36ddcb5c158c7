#include "megaton/kernels/norm.h"

#include "megaton/kernels/cpu/norm.h"
#ifdef MEGATON_WITH_CUDA
#include "megaton/kernels/cuda/norm.h"
#endif

namespace megaton::kernels {

namespace {

struct NormShape {
  int64_t N, C;
};

// x, every activation-shaped tensor [N, C] and every statistic [N], with C = weight.numel().
NormShape check_norm(std::string_view op, const Tensor& weight, const Tensor& x,
                     std::initializer_list<const Tensor*> like_x, std::initializer_list<const Tensor*> stats) {
  const int64_t C = weight.numel();
  if (C == 0 || x.dim() == 0 || x.size(-1) != C)
    fail("kernel ", op, ": input '", x.name(), "' has shape ", shape_str(x.shape()), ", expected [..., ", C, "]");
  const int64_t N = x.numel() / C;
  for (const Tensor* t : like_x) expect_matrix(op, *t, N, C);
  for (const Tensor* t : stats) expect_matrix(op, *t, 1, N);
  return {N, C};
}

// Runs f(T{}) for the CPU element type after checking every tensor holds it.
template <typename F>
void on_cpu(std::string_view op, const Tensor& like, std::initializer_list<const Tensor*> tensors, F&& f) {
  expect_dtype(like.dtype(), op, tensors);
  dispatch_cpu_float(like.dtype(), op, f);
}

}  // namespace

void layernorm_forward(const ExecContext& ctx, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                       const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  constexpr std::string_view op = "layernorm_forward";
  expect_on_device(ctx, op, {&out, &mean, &rstd, &x, &weight});
  if (bias.defined()) expect_on_device(ctx, op, {&bias});
  const NormShape s = check_norm(op, weight, x, {&out}, {&mean, &rstd});
  if (!ctx.device.is_cpu()) fail_no_backend(ctx, op);
  on_cpu(op, x, {&out, &mean, &rstd, &weight}, [&]<typename T>(T) {
    if (bias.defined()) expect_dtype(x.dtype(), op, {&bias});
    cpu::layernorm_forward(out.data<T>(), mean.data<T>(), rstd.data<T>(), x.data<T>(), weight.data<T>(),
                           data_or_null<T>(bias), s.N, s.C, eps);
  });
}

void layernorm_backward_input(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x,
                              const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  constexpr std::string_view op = "layernorm_backward_input";
  expect_on_device(ctx, op, {&dx, &dout, &x, &weight, &mean, &rstd});
  const NormShape s = check_norm(op, weight, x, {&dx, &dout}, {&mean, &rstd});
  if (!ctx.device.is_cpu()) fail_no_backend(ctx, op);
  on_cpu(op, x, {&dx, &dout, &weight, &mean, &rstd}, [&]<typename T>(T) {
    cpu::layernorm_backward_input(dx.data<T>(), dout.data<T>(), x.data<T>(), weight.data<T>(), mean.data<T>(),
                                  rstd.data<T>(), s.N, s.C);
  });
}

void layernorm_backward_weight(const ExecContext& ctx, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                               const Tensor& x, const Tensor& mean, const Tensor& rstd) {
  constexpr std::string_view op = "layernorm_backward_weight";
  expect_on_device(ctx, op, {&dweight, &dout, &x, &mean, &rstd});
  if (dbias.defined()) expect_on_device(ctx, op, {&dbias});
  const NormShape s = check_norm(op, dweight, x, {&dout}, {&mean, &rstd});
  if (!ctx.device.is_cpu()) fail_no_backend(ctx, op);
  on_cpu(op, x, {&dweight, &dout, &mean, &rstd}, [&]<typename T>(T) {
    if (dbias.defined()) expect_dtype(x.dtype(), op, {&dbias});
    cpu::layernorm_backward_weight(dweight.data<T>(), data_or_null<T>(dbias), dout.data<T>(), x.data<T>(), mean.data<T>(),
                                   rstd.data<T>(), s.N, s.C);
  });
}

void rmsnorm_forward(const ExecContext& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x,
                     const Tensor& weight, double eps) {
  constexpr std::string_view op = "rmsnorm_forward";
  expect_on_device(ctx, op, {&out, &rstd, &x, &weight});
  const NormShape s = check_norm(op, weight, x, {&out}, {&rstd});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::rmsnorm_forward(ctx, out, rstd, x, weight, eps, s.N, s.C);
#endif
    fail_no_backend(ctx, op);
  }
  on_cpu(op, x, {&out, &rstd, &weight}, [&]<typename T>(T) {
    cpu::rmsnorm_forward(out.data<T>(), rstd.data<T>(), x.data<T>(), weight.data<T>(), s.N, s.C, eps);
  });
}

void rmsnorm_backward_input(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x,
                            const Tensor& weight, const Tensor& rstd) {
  constexpr std::string_view op = "rmsnorm_backward_input";
  expect_on_device(ctx, op, {&dx, &dout, &x, &weight, &rstd});
  const NormShape s = check_norm(op, weight, x, {&dx, &dout}, {&rstd});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::rmsnorm_backward_input(ctx, dx, dout, x, weight, rstd, s.N, s.C);
#endif
    fail_no_backend(ctx, op);
  }
  on_cpu(op, x, {&dx, &dout, &weight, &rstd}, [&]<typename T>(T) {
    cpu::rmsnorm_backward_input(dx.data<T>(), dout.data<T>(), x.data<T>(), weight.data<T>(), rstd.data<T>(), s.N,
                                s.C);
  });
}

void rmsnorm_backward_weight(const ExecContext& ctx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                             const Tensor& rstd) {
  constexpr std::string_view op = "rmsnorm_backward_weight";
  expect_on_device(ctx, op, {&dweight, &dout, &x, &rstd});
  const NormShape s = check_norm(op, dweight, x, {&dout}, {&rstd});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::rmsnorm_backward_weight(ctx, dweight, dout, x, rstd, s.N, s.C);
#endif
    fail_no_backend(ctx, op);
  }
  on_cpu(op, x, {&dweight, &dout, &rstd}, [&]<typename T>(T) {
    cpu::rmsnorm_backward_weight(dweight.data<T>(), dout.data<T>(), x.data<T>(), rstd.data<T>(), s.N, s.C);
  });
}

}  // namespace megaton::kernels
