#include "megaton/kernels/cross_entropy.h"

#include "megaton/kernels/cpu/cross_entropy.h"
#ifdef MEGATON_WITH_CUDA
#include "megaton/kernels/cuda/cross_entropy.h"
#endif

namespace megaton::kernels {

namespace {
// logits [N, V], every per-row tensor [N], targets i32; returns {N, V}.
std::pair<int64_t, int64_t> check_ce(std::string_view op, const Tensor& logits, const Tensor& targets,
                                     std::initializer_list<const Tensor*> per_row) {
  if (logits.dim() != 2) fail("kernel ", op, ": logits '", logits.name(), "' has shape ", shape_str(logits.shape()), ", expected [N, V]");
  const int64_t N = logits.size(0), V = logits.size(1);
  expect_dtype(DType::I32, op, {&targets});
  expect_matrix(op, targets, 1, N);
  for (const Tensor* t : per_row) expect_matrix(op, *t, 1, N);
  return {N, V};
}
}  // namespace

void cross_entropy_forward(const ExecContext& ctx, const Tensor& loss, const Tensor& lse, const Tensor& logits,
                           const Tensor& targets) {
  constexpr std::string_view op = "cross_entropy_forward";
  expect_on_device(ctx, op, {&loss, &lse, &logits, &targets});
  const auto [N, V] = check_ce(op, logits, targets, {&loss, &lse});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::cross_entropy_forward(ctx, loss, lse, logits, targets, N, V);
#endif
    fail_no_backend(ctx, op);
  }
  expect_dtype(logits.dtype(), op, {&loss, &lse});
  dispatch_cpu_float(logits.dtype(), op, [&]<typename T>(T) {
    cpu::cross_entropy_forward(loss.data<T>(), lse.data<T>(), logits.data<T>(), targets.data<int32_t>(), N, V);
  });
}

void cross_entropy_backward(const ExecContext& ctx, const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                            const Tensor& targets, double grad_scale) {
  constexpr std::string_view op = "cross_entropy_backward";
  expect_on_device(ctx, op, {&dlogits, &logits, &lse, &targets});
  const auto [N, V] = check_ce(op, logits, targets, {&lse});
  expect_matrix(op, dlogits, N, V);
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::cross_entropy_backward(ctx, dlogits, logits, lse, targets, grad_scale, N, V);
#endif
    fail_no_backend(ctx, op);
  }
  expect_dtype(logits.dtype(), op, {&dlogits, &lse});
  dispatch_cpu_float(logits.dtype(), op, [&]<typename T>(T) {
    cpu::cross_entropy_backward(dlogits.data<T>(), logits.data<T>(), lse.data<T>(), targets.data<int32_t>(),
                                static_cast<T>(grad_scale), N, V);
  });
}

}  // namespace megaton::kernels
