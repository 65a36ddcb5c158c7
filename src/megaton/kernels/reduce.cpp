#include "megaton/kernels/reduce.h"

#include "megaton/kernels/cpu/reduce.h"
#ifdef MEGATON_WITH_CUDA
#include "megaton/kernels/cuda/reduce.h"
#endif

namespace megaton::kernels {

double sum(const ExecContext& ctx, const Tensor& x) {
  constexpr std::string_view op = "sum";
  expect_on_device(ctx, op, {&x});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::sum(ctx, x);
#endif
    fail_no_backend(ctx, op);
  }
  double s = 0;
  dispatch_cpu_float(x.dtype(), op, [&]<typename T>(T) { s = cpu::sum(x.data<T>(), x.numel()); });
  return s;
}

float abs_max(const ExecContext& ctx, const Tensor& x) {
  constexpr std::string_view op = "abs_max";
  expect_on_device(ctx, op, {&x});
  if (ctx.device.is_cuda()) fail_no_backend(ctx, op);
  float m = 0;
  dispatch_cpu_io(x.dtype(), op, [&]<typename T>(T) { m = cpu::abs_max(x.data<T>(), x.numel()); });
  return m;
}

int64_t count_not_equal(const ExecContext& ctx, const Tensor& ids, int32_t value) {
  constexpr std::string_view op = "count_not_equal";
  expect_on_device(ctx, op, {&ids});
  expect_dtype(DType::I32, op, {&ids});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::count_not_equal(ctx, ids, value);
#endif
    fail_no_backend(ctx, op);
  }
  return cpu::count_not_equal(ids.data<int32_t>(), ids.numel(), value);
}

int64_t first_out_of_range(const ExecContext& ctx, const Tensor& ids, int64_t limit, std::optional<int32_t> ignore) {
  constexpr std::string_view op = "first_out_of_range";
  expect_on_device(ctx, op, {&ids});
  expect_dtype(DType::I32, op, {&ids});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::first_out_of_range(ctx, ids, limit, ignore);
#endif
    fail_no_backend(ctx, op);
  }
  return cpu::first_out_of_range(ids.data<int32_t>(), ids.numel(), limit, ignore ? &*ignore : nullptr);
}

}  // namespace megaton::kernels
