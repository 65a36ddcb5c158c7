#include "megaton/kernels/embedding.h"

#include "megaton/kernels/cpu/embedding.h"
#ifdef MEGATON_WITH_CUDA
#include "megaton/kernels/cuda/embedding.h"
#endif

namespace megaton::kernels {

namespace {
struct EmbeddingShape {
  int64_t B, T, C;
};

// tokens [B, T] i32, table [*, C], rows [B*T, C], positions [T, C] when defined.
EmbeddingShape check_embedding(std::string_view op, const Tensor& tokens, const Tensor& table, const Tensor& rows,
                               const Tensor& positions) {
  expect_dtype(DType::I32, op, {&tokens});
  if (tokens.dim() != 2) fail("kernel ", op, ": tokens '", tokens.name(), "' has shape ", shape_str(tokens.shape()), ", expected [B, T]");
  if (table.dim() != 2) fail("kernel ", op, ": table '", table.name(), "' has shape ", shape_str(table.shape()), ", expected [vocab, C]");
  const EmbeddingShape s{tokens.size(0), tokens.size(1), table.size(1)};
  expect_matrix(op, rows, s.B * s.T, s.C);
  if (positions.defined()) expect_matrix(op, positions, s.T, s.C);
  return s;
}
}  // namespace

void embedding_forward(const ExecContext& ctx, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                       const Tensor& wpe) {
  constexpr std::string_view op = "embedding_forward";
  expect_on_device(ctx, op, {&out, &tokens, &wte});
  if (wpe.defined()) expect_on_device(ctx, op, {&wpe});
  const EmbeddingShape s = check_embedding(op, tokens, wte, out, wpe);
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::embedding_forward(ctx, out, tokens, wte, wpe, s.B, s.T, s.C);
#endif
    fail_no_backend(ctx, op);
  }
  if (wpe.defined()) expect_dtype(out.dtype(), op, {&wpe});
  if (wte.dtype() == DType::BF16 && out.dtype() == DType::F32)
    return cpu::embedding_forward(out.data<float>(), tokens.data<int32_t>(), wte.data<BFloat16>(),
                                  data_or_null<float>(wpe), s.B, s.T, s.C);
  expect_dtype(wte.dtype(), op, {&out});
  dispatch_cpu_float(wte.dtype(), op, [&]<typename T>(T) {
    cpu::embedding_forward(out.data<T>(), tokens.data<int32_t>(), wte.data<T>(), data_or_null<T>(wpe),
                           s.B, s.T, s.C);
  });
}

void embedding_backward(const ExecContext& ctx, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                        const Tensor& tokens) {
  constexpr std::string_view op = "embedding_backward";
  expect_on_device(ctx, op, {&dwte, &dout, &tokens});
  if (dwpe.defined()) expect_on_device(ctx, op, {&dwpe});
  const EmbeddingShape s = check_embedding(op, tokens, dwte, dout, dwpe);
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::embedding_backward(ctx, dwte, dwpe, dout, tokens, s.B, s.T, s.C);
#endif
    fail_no_backend(ctx, op);
  }
  expect_dtype(dwte.dtype(), op, {&dout});
  if (dwpe.defined()) expect_dtype(dwte.dtype(), op, {&dwpe});
  dispatch_cpu_float(dwte.dtype(), op, [&]<typename T>(T) {
    cpu::embedding_backward(dwte.data<T>(), data_or_null<T>(dwpe), dout.data<T>(), tokens.data<int32_t>(), s.B, s.T, s.C);
  });
}

}  // namespace megaton::kernels
