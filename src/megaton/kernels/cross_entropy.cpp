#include "megaton/kernels/cross_entropy.h"

#include "megaton/kernels/cpu/cross_entropy.h"

namespace megaton::kernels {

namespace {
// Checks what every cross-entropy kernel shares: all tensors on ctx's device, the cpu backend,
// targets i32 [N] and each per-row tensor [N] in the dtype of `like`. Returns N.
int64_t check_rows(const ExecContext& ctx, std::string_view op, const Tensor& like, const Tensor& targets,
                   std::initializer_list<const Tensor*> per_row) {
  expect_on_device(ctx, op, {&like, &targets});
  expect_on_device(ctx, op, per_row);
  if (!ctx.device.is_cpu()) fail_no_backend(ctx, op);
  expect_dtype(DType::I32, op, {&targets});
  const int64_t N = targets.numel();
  for (const Tensor* t : per_row) expect_matrix(op, *t, 1, N);
  expect_dtype(like.dtype(), op, per_row);
  return N;
}

// logits must be [N, V] for the N targets; returns V.
int64_t check_logits(std::string_view op, const Tensor& logits, int64_t N) {
  if (logits.dim() != 2 || logits.size(0) != N)
    fail("kernel ", op, ": logits '", logits.name(), "' has shape ", shape_str(logits.shape()), ", expected [", N,
         ", V] for ", N, " targets");
  return logits.size(1);
}
}  // namespace

void cross_entropy_row_max(const ExecContext& ctx, const Tensor& row_max, const Tensor& logits) {
  constexpr std::string_view op = "cross_entropy_row_max";
  expect_on_device(ctx, op, {&row_max, &logits});
  if (!ctx.device.is_cpu()) fail_no_backend(ctx, op);
  if (logits.dim() != 2) fail("kernel ", op, ": logits '", logits.name(), "' has shape ", shape_str(logits.shape()), ", expected [N, V]");
  const int64_t N = logits.size(0), V = logits.size(1);
  expect_matrix(op, row_max, 1, N);
  expect_dtype(logits.dtype(), op, {&row_max});
  dispatch_cpu_float(logits.dtype(), op, [&]<typename T>(T) {
    cpu::cross_entropy_row_max(row_max.data<T>(), logits.data<T>(), N, V);
  });
}

void cross_entropy_sum_exp(const ExecContext& ctx, const Tensor& sum_exp, const Tensor& target_logit,
                           const Tensor& logits, const Tensor& row_max, const Tensor& targets, int64_t vocab_start) {
  constexpr std::string_view op = "cross_entropy_sum_exp";
  const int64_t N = check_rows(ctx, op, logits, targets, {&sum_exp, &target_logit, &row_max});
  const int64_t V = check_logits(op, logits, N);
  dispatch_cpu_float(logits.dtype(), op, [&]<typename T>(T) {
    cpu::cross_entropy_sum_exp(sum_exp.data<T>(), target_logit.data<T>(), logits.data<T>(), row_max.data<T>(),
                               targets.data<int32_t>(), vocab_start, N, V);
  });
}

void cross_entropy_loss(const ExecContext& ctx, const Tensor& loss, const Tensor& lse, const Tensor& row_max,
                        const Tensor& sum_exp, const Tensor& target_logit, const Tensor& targets) {
  constexpr std::string_view op = "cross_entropy_loss";
  const int64_t N = check_rows(ctx, op, loss, targets, {&lse, &row_max, &sum_exp, &target_logit, &loss});
  dispatch_cpu_float(loss.dtype(), op, [&]<typename T>(T) {
    cpu::cross_entropy_loss(loss.data<T>(), lse.data<T>(), row_max.data<T>(), sum_exp.data<T>(),
                            target_logit.data<T>(), targets.data<int32_t>(), N);
  });
}

void cross_entropy_backward(const ExecContext& ctx, const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                            const Tensor& targets, int64_t vocab_start, double grad_scale) {
  constexpr std::string_view op = "cross_entropy_backward";
  const int64_t N = check_rows(ctx, op, logits, targets, {&lse});
  const int64_t V = check_logits(op, logits, N);
  expect_on_device(ctx, op, {&dlogits});
  expect_matrix(op, dlogits, N, V);
  expect_dtype(logits.dtype(), op, {&dlogits});
  dispatch_cpu_float(logits.dtype(), op, [&]<typename T>(T) {
    cpu::cross_entropy_backward(dlogits.data<T>(), logits.data<T>(), lse.data<T>(), targets.data<int32_t>(),
                                vocab_start, static_cast<T>(grad_scale), N, V);
  });
}

}  // namespace megaton::kernels
