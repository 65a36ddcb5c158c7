#include "megaton/kernels/cross_entropy.h"

#include "megaton/kernels/cpu/cross_entropy.h"
#ifdef MEGATON_WITH_CUDA
#include "megaton/kernels/cuda/cross_entropy.h"
#endif

namespace megaton::kernels {

namespace {
// Per-row statistics are f64 for f64 logits, else f32 (TransformerEngine's convention: bf16 logits
// still get fp32 statistics).
DType stat_dtype(const Tensor& logits) { return logits.dtype() == DType::F64 ? DType::F64 : DType::F32; }

// Checks what every row kernel shares: all tensors on ctx's device, targets i32 [N] and each
// per-row tensor [N] in the statistics dtype of `logits`. Returns N.
int64_t check_rows(const ExecContext& ctx, std::string_view op, const Tensor& logits, const Tensor& targets,
                   std::initializer_list<const Tensor*> per_row) {
  expect_on_device(ctx, op, {&logits, &targets});
  expect_on_device(ctx, op, per_row);
  expect_dtype(DType::I32, op, {&targets});
  const int64_t N = targets.numel();
  for (const Tensor* t : per_row) expect_matrix(op, *t, 1, N);
  expect_dtype(stat_dtype(logits), op, per_row);
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
  if (logits.dim() != 2) fail("kernel ", op, ": logits '", logits.name(), "' has shape ", shape_str(logits.shape()), ", expected [N, V]");
  const int64_t N = logits.size(0), V = logits.size(1);
  expect_on_device(ctx, op, {&row_max, &logits});
  expect_matrix(op, row_max, 1, N);
  expect_dtype(stat_dtype(logits), op, {&row_max});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::cross_entropy_row_max(ctx, row_max, logits, N, V);
#endif
    fail_no_backend(ctx, op);
  }
  dispatch_cpu_io(logits.dtype(), op, [&]<typename L>(L) {
    cpu::cross_entropy_row_max(row_max.data<cpu::compute_t<L>>(), logits.data<L>(), N, V);
  });
}

void cross_entropy_sum_exp(const ExecContext& ctx, const Tensor& sum_exp, const Tensor& target_logit,
                           const Tensor& logits, const Tensor& row_max, const Tensor& targets, int64_t vocab_start) {
  constexpr std::string_view op = "cross_entropy_sum_exp";
  const int64_t N = check_rows(ctx, op, logits, targets, {&sum_exp, &target_logit, &row_max});
  const int64_t V = check_logits(op, logits, N);
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::cross_entropy_sum_exp(ctx, sum_exp, target_logit, logits, row_max, targets, vocab_start, N, V);
#endif
    fail_no_backend(ctx, op);
  }
  dispatch_cpu_io(logits.dtype(), op, [&]<typename L>(L) {
    using T = cpu::compute_t<L>;
    cpu::cross_entropy_sum_exp(sum_exp.data<T>(), target_logit.data<T>(), logits.data<L>(), row_max.data<T>(),
                               targets.data<int32_t>(), vocab_start, N, V);
  });
}

void cross_entropy_loss(const ExecContext& ctx, const Tensor& loss, const Tensor& lse, const Tensor& row_max,
                        const Tensor& sum_exp, const Tensor& target_logit, const Tensor& targets) {
  constexpr std::string_view op = "cross_entropy_loss";
  // Every tensor here is a statistic: the loss's dtype stands for the logits'.
  const int64_t N = check_rows(ctx, op, loss, targets, {&loss, &lse, &row_max, &sum_exp, &target_logit});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::cross_entropy_loss(ctx, loss, lse, row_max, sum_exp, target_logit, targets, N);
#endif
    fail_no_backend(ctx, op);
  }
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
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::cross_entropy_backward(ctx, dlogits, logits, lse, targets, vocab_start, grad_scale, N, V);
#endif
    fail_no_backend(ctx, op);
  }
  dispatch_cpu_io(logits.dtype(), op, [&]<typename L>(L) {
    using T = cpu::compute_t<L>;
    cpu::cross_entropy_backward(dlogits.data<L>(), logits.data<L>(), lse.data<T>(), targets.data<int32_t>(),
                                vocab_start, static_cast<T>(grad_scale), N, V);
  });
}

}  // namespace megaton::kernels
