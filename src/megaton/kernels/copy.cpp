#include "megaton/kernels/copy.h"

#include "megaton/kernels/cpu/copy.h"
#include "megaton/kernels/cpu/element.h"
#include "megaton/kernels/cpu/kv_fp8.h"
#ifdef MEGATON_WITH_CUDA
#include "megaton/kernels/cuda/copy.h"
#endif

namespace megaton::kernels {

namespace {
void check_block(std::string_view op, const BlockAt& at, int64_t rows, int64_t cols) {
  const Tensor& t = at.t;
  if (t.dim() != 3) fail("kernel ", op, ": tensor '", t.name(), "' has shape ", shape_str(t.shape()), ", expected [B, R, C]");
  if (at.row < 0 || at.col < 0 || rows < 0 || cols < 0 || at.row > t.size(1) - rows || at.col > t.size(2) - cols)
    fail("kernel ", op, ": a block of ", rows, " x ", cols, " at row ", at.row, ", column ", at.col,
         " does not fit tensor '", t.name(), "' of shape ", shape_str(t.shape()));
}
}  // namespace

void copy_rows(const ExecContext& ctx, BlockAt dst, BlockAt src, int64_t rows, int64_t cols) {
  constexpr std::string_view op = "copy_rows";
  expect_on_device(ctx, op, {&dst.t, &src.t});
  check_block(op, dst, rows, cols);
  check_block(op, src, rows, cols);
  if (dst.t.size(0) != src.t.size(0))
    fail("kernel ", op, ": '", dst.t.name(), "' has ", dst.t.size(0), " batch rows, '", src.t.name(), "' ",
         src.t.size(0));
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::copy_rows(ctx, dst.t, dst.row, dst.col, src.t, src.row, src.col, rows, cols);
#endif
    fail_no_backend(ctx, op);
  }
  expect_dtype(src.t.dtype(), op, {&dst.t});
  dispatch_cpu_io(src.t.dtype(), op, [&]<typename T>(T) {
    cpu::copy_rows(dst.t.data<T>(), dst.t.size(1), dst.t.size(2), dst.row, dst.col, src.t.data<T>(), src.t.size(1),
                   src.t.size(2), src.row, src.col, src.t.size(0), rows, cols);
  });
}

namespace {
// The shared checks of broadcast_rows and sum_rows: `wide` holds `copies` rows from its corner,
// `one` a single row.
void check_shared_rows(std::string_view op, const BlockAt& wide, const BlockAt& one, int64_t copies, int64_t cols) {
  check_block(op, wide, copies, cols);
  check_block(op, one, 1, cols);
  if (wide.t.size(0) != one.t.size(0))
    fail("kernel ", op, ": '", wide.t.name(), "' has ", wide.t.size(0), " batch rows, '", one.t.name(), "' ",
         one.t.size(0));
  expect_dtype(wide.t.dtype(), op, {&one.t});
}
}  // namespace

void broadcast_rows(const ExecContext& ctx, BlockAt dst, BlockAt src, int64_t copies, int64_t cols) {
  constexpr std::string_view op = "broadcast_rows";
  expect_on_device(ctx, op, {&dst.t, &src.t});
  check_shared_rows(op, dst, src, copies, cols);
  if (!ctx.device.is_cpu()) fail_no_backend(ctx, op);
  dispatch_cpu_io(src.t.dtype(), op, [&]<typename T>(T) {
    cpu::broadcast_rows(dst.t.data<T>(), dst.t.size(1), dst.t.size(2), dst.row, dst.col, src.t.data<T>(),
                        src.t.size(1), src.t.size(2), src.row, src.col, src.t.size(0), copies, cols);
  });
}

void sum_rows(const ExecContext& ctx, BlockAt dst, BlockAt src, int64_t copies, int64_t cols) {
  constexpr std::string_view op = "sum_rows";
  expect_on_device(ctx, op, {&dst.t, &src.t});
  check_shared_rows(op, src, dst, copies, cols);
  if (!ctx.device.is_cpu()) fail_no_backend(ctx, op);
  dispatch_cpu_io(src.t.dtype(), op, [&]<typename T>(T) {
    cpu::sum_rows(dst.t.data<T>(), dst.t.size(1), dst.t.size(2), dst.row, dst.col, src.t.data<T>(), src.t.size(1),
                  src.t.size(2), src.row, src.col, src.t.size(0), copies, cols);
  });
}

void fill_columns(const ExecContext& ctx, const Tensor& t, int64_t from, double value) {
  constexpr std::string_view op = "fill_columns";
  expect_on_device(ctx, op, {&t});
  if (t.dim() != 2 || from < 0 || from > t.size(1))
    fail("kernel ", op, ": columns from ", from, " of tensor '", t.name(), "' of shape ", shape_str(t.shape()),
         " (expected a matrix with at least that many columns)");
  if (ctx.device.is_cuda()) fail_no_backend(ctx, op);
  dispatch_cpu_io(t.dtype(), op, [&]<typename T>(T) {
    cpu::fill_columns(t.data<T>(), t.size(0), t.size(1), from, cpu::store<T>(static_cast<cpu::compute_t<T>>(value)));
  });
}

namespace {
// The shared checks of encode_fp8_rows / decode_fp8_rows; the f32 block's batch row 0 is used.
void check_fp8_rows(std::string_view op, const ExecContext& ctx, const Tensor& codes, const Tensor& scales, int64_t row,
                    const BlockAt& values, int64_t rows) {
  expect_on_device(ctx, op, {&codes, &scales, &values.t});
  if (!ctx.device.is_cpu()) fail_no_backend(ctx, op);
  if (codes.dim() != 3 || codes.dtype() != DType::F8E4M3 || scales.dtype() != DType::F32 || values.t.dtype() != DType::F32)
    fail("kernel ", op, ": codes must be F8E4M3 [1, R, D], scales and values F32; got ", dtype_name(codes.dtype()), ", ",
         dtype_name(scales.dtype()), ", ", dtype_name(values.t.dtype()));
  const int64_t D = codes.size(2);
  check_block(op, {codes, row, 0}, rows, D);
  check_block(op, {scales, row, 0}, rows, 1);
  check_block(op, values, rows, D);
}
}  // namespace

void encode_fp8_rows(const ExecContext& ctx, const Tensor& codes, const Tensor& scales, int64_t row, BlockAt src,
                     int64_t rows) {
  check_fp8_rows("encode_fp8_rows", ctx, codes, scales, row, src, rows);
  const int64_t D = codes.size(2);
  cpu::quantize_kv_heads(src.t.data<float>() + src.row * src.t.size(2) + src.col, src.t.size(2),
                         static_cast<uint8_t*>(codes.raw()) + row * D, scales.data<float>() + row, rows, D);
}

void decode_fp8_rows(const ExecContext& ctx, BlockAt dst, const Tensor& codes, const Tensor& scales, int64_t row,
                     int64_t rows) {
  check_fp8_rows("decode_fp8_rows", ctx, codes, scales, row, dst, rows);
  const int64_t D = codes.size(2);
  cpu::dequantize_kv_heads(static_cast<const uint8_t*>(codes.raw()) + row * D, scales.data<float>() + row,
                           dst.t.data<float>() + dst.row * dst.t.size(2) + dst.col, dst.t.size(2), rows, D);
}

}  // namespace megaton::kernels
