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

// A defined dresidual is shaped and typed as dx and is not dx itself (the cpu kernel reads it with
// __restrict).
NormShape check_residual_gradient(const ExecContext& ctx, std::string_view op, NormShape s, const Tensor& dx,
                                  const Tensor& dresidual) {
  if (!dresidual.defined()) return s;
  expect_on_device(ctx, op, {&dresidual});
  expect_matrix(op, dresidual, s.N, s.C);
  expect_dtype(dx.dtype(), op, {&dresidual});
  if (dresidual.raw() == dx.raw()) fail("kernel ", op, ": dresidual '", dresidual.name(), "' must not be dx itself");
  return s;
}

// Runs f(T{}, W{}) for the activation type T of x (f32, f64 or bf16; every tensor in `acts` holds
// it) and the parameter type W of `param` (see dispatch_cpu_param; every tensor in `params` holds
// it), after checking that the statistics hold compute_t<T> (f32 for bf16 activations).
template <typename F>
void on_cpu(std::string_view op, const Tensor& x, std::initializer_list<const Tensor*> acts, const Tensor& param,
            std::initializer_list<const Tensor*> params, std::initializer_list<const Tensor*> stats, F&& f) {
  dispatch_cpu_io(x.dtype(), op, [&]<typename T>(T) {
    expect_dtype(x.dtype(), op, acts);
    expect_dtype(dtype_of<cpu::compute_t<T>>(), op, stats);
    dispatch_cpu_param<T>(op, param, [&]<typename W>(W) {
      for (const Tensor* t : params)
        if (t->defined()) expect_dtype(param.dtype(), op, {t});
      f(T{}, W{});
    });
  });
}

}  // namespace

void layernorm_forward(const ExecContext& ctx, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                       const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  constexpr std::string_view op = "layernorm_forward";
  expect_on_device(ctx, op, {&out, &mean, &rstd, &x, &weight});
  if (bias.defined()) expect_on_device(ctx, op, {&bias});
  const NormShape s = check_norm(op, weight, x, {&out}, {&mean, &rstd});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::norm_forward(ctx, Tensor(), out, mean, rstd, x, Tensor(), weight, bias, eps, s.N, s.C);
#endif
    fail_no_backend(ctx, op);
  }
  on_cpu(op, x, {&out}, weight, {&bias}, {&mean, &rstd}, [&]<typename T, typename W>(T, W) {
    using S = cpu::compute_t<T>;
    cpu::layernorm_forward(out.data<T>(), mean.data<S>(), rstd.data<S>(), x.data<T>(), weight.data<W>(),
                           data_or_null<W>(bias), s.N, s.C, eps);
  });
}

void add_layernorm_forward(const ExecContext& ctx, const Tensor& sum, const Tensor& out, const Tensor& mean,
                           const Tensor& rstd, const Tensor& x, const Tensor& residual, const Tensor& weight,
                           const Tensor& bias, double eps) {
  constexpr std::string_view op = "add_layernorm_forward";
  expect_on_device(ctx, op, {&sum, &out, &mean, &rstd, &x, &residual, &weight});
  if (bias.defined()) expect_on_device(ctx, op, {&bias});
  const NormShape s = check_norm(op, weight, x, {&sum, &out, &residual}, {&mean, &rstd});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::norm_forward(ctx, sum, out, mean, rstd, x, residual, weight, bias, eps, s.N, s.C);
#endif
    fail_no_backend(ctx, op);
  }
  on_cpu(op, x, {&sum, &out, &residual}, weight, {&bias}, {&mean, &rstd}, [&]<typename T, typename W>(T, W) {
    using S = cpu::compute_t<T>;
    cpu::add_layernorm_forward(sum.data<T>(), out.data<T>(), mean.data<S>(), rstd.data<S>(), x.data<T>(),
                               residual.data<T>(), weight.data<W>(), data_or_null<W>(bias), s.N, s.C, eps);
  });
}

void layernorm_backward_input(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x,
                              const Tensor& weight, const Tensor& mean, const Tensor& rstd, const Tensor& dresidual) {
  constexpr std::string_view op = "layernorm_backward_input";
  expect_on_device(ctx, op, {&dx, &dout, &x, &weight, &mean, &rstd});
  const NormShape s = check_residual_gradient(ctx, op, check_norm(op, weight, x, {&dx, &dout}, {&mean, &rstd}), dx,
                                              dresidual);
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::norm_backward_input(ctx, dx, dout, x, weight, mean, rstd, dresidual, s.N, s.C);
#endif
    fail_no_backend(ctx, op);
  }
  on_cpu(op, x, {&dx, &dout}, weight, {}, {&mean, &rstd}, [&]<typename T, typename W>(T, W) {
    using S = cpu::compute_t<T>;
    cpu::layernorm_backward_input(dx.data<T>(), dout.data<T>(), x.data<T>(), weight.data<W>(), mean.data<S>(),
                                  rstd.data<S>(), s.N, s.C, data_or_null<T>(dresidual));
  });
}

void layernorm_backward_weight(const ExecContext& ctx, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                               const Tensor& x, const Tensor& mean, const Tensor& rstd) {
  constexpr std::string_view op = "layernorm_backward_weight";
  expect_on_device(ctx, op, {&dweight, &dout, &x, &mean, &rstd});
  if (dbias.defined()) expect_on_device(ctx, op, {&dbias});
  const NormShape s = check_norm(op, dweight, x, {&dout}, {&mean, &rstd});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::norm_backward_weight(ctx, dweight, dbias, dout, x, mean, rstd, s.N, s.C);
#endif
    fail_no_backend(ctx, op);
  }
  on_cpu(op, x, {&dout}, dweight, {&dbias}, {&mean, &rstd}, [&]<typename T, typename W>(T, W) {
    using S = cpu::compute_t<T>;
    cpu::layernorm_backward_weight(dweight.data<W>(), data_or_null<W>(dbias), dout.data<T>(), x.data<T>(),
                                   mean.data<S>(), rstd.data<S>(), s.N, s.C);
  });
}

void rmsnorm_forward(const ExecContext& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x,
                     const Tensor& weight, double eps) {
  constexpr std::string_view op = "rmsnorm_forward";
  expect_on_device(ctx, op, {&out, &rstd, &x, &weight});
  const NormShape s = check_norm(op, weight, x, {&out}, {&rstd});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::norm_forward(ctx, Tensor(), out, Tensor(), rstd, x, Tensor(), weight, Tensor(), eps, s.N, s.C);
#endif
    fail_no_backend(ctx, op);
  }
  on_cpu(op, x, {&out}, weight, {}, {&rstd}, [&]<typename T, typename W>(T, W) {
    cpu::rmsnorm_forward(out.data<T>(), rstd.data<cpu::compute_t<T>>(), x.data<T>(), weight.data<W>(), s.N, s.C, eps);
  });
}

void add_rmsnorm_forward(const ExecContext& ctx, const Tensor& sum, const Tensor& out, const Tensor& rstd,
                         const Tensor& x, const Tensor& residual, const Tensor& weight, double eps) {
  constexpr std::string_view op = "add_rmsnorm_forward";
  expect_on_device(ctx, op, {&sum, &out, &rstd, &x, &residual, &weight});
  const NormShape s = check_norm(op, weight, x, {&sum, &out, &residual}, {&rstd});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::norm_forward(ctx, sum, out, Tensor(), rstd, x, residual, weight, Tensor(), eps, s.N, s.C);
#endif
    fail_no_backend(ctx, op);
  }
  on_cpu(op, x, {&sum, &out, &residual}, weight, {}, {&rstd}, [&]<typename T, typename W>(T, W) {
    cpu::add_rmsnorm_forward(sum.data<T>(), out.data<T>(), rstd.data<cpu::compute_t<T>>(), x.data<T>(),
                             residual.data<T>(), weight.data<W>(), s.N, s.C, eps);
  });
}

void rmsnorm_backward_input(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x,
                            const Tensor& weight, const Tensor& rstd, const Tensor& dresidual) {
  constexpr std::string_view op = "rmsnorm_backward_input";
  expect_on_device(ctx, op, {&dx, &dout, &x, &weight, &rstd});
  const NormShape s =
      check_residual_gradient(ctx, op, check_norm(op, weight, x, {&dx, &dout}, {&rstd}), dx, dresidual);
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::norm_backward_input(ctx, dx, dout, x, weight, Tensor(), rstd, dresidual, s.N, s.C);
#endif
    fail_no_backend(ctx, op);
  }
  on_cpu(op, x, {&dx, &dout}, weight, {}, {&rstd}, [&]<typename T, typename W>(T, W) {
    cpu::rmsnorm_backward_input(dx.data<T>(), dout.data<T>(), x.data<T>(), weight.data<W>(),
                                rstd.data<cpu::compute_t<T>>(), s.N, s.C, data_or_null<T>(dresidual));
  });
}

void rmsnorm_backward_weight(const ExecContext& ctx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                             const Tensor& rstd) {
  constexpr std::string_view op = "rmsnorm_backward_weight";
  expect_on_device(ctx, op, {&dweight, &dout, &x, &rstd});
  const NormShape s = check_norm(op, dweight, x, {&dout}, {&rstd});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::norm_backward_weight(ctx, dweight, Tensor(), dout, x, Tensor(), rstd, s.N, s.C);
#endif
    fail_no_backend(ctx, op);
  }
  on_cpu(op, x, {&dout}, dweight, {}, {&rstd}, [&]<typename T, typename W>(T, W) {
    cpu::rmsnorm_backward_weight(dweight.data<W>(), dout.data<T>(), x.data<T>(), rstd.data<cpu::compute_t<T>>(), s.N,
                                 s.C);
  });
}

}  // namespace megaton::kernels
