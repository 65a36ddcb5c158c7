#include "megaton/kernels/exec_context.h"

namespace megaton::kernels {

void expect_on_device(const ExecContext& ctx, std::string_view op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    if (!t->defined()) fail("kernel ", op, ": an input or output tensor is undefined");
    if (t->device() != ctx.device)
      fail("kernel ", op, ": tensor '", t->name(), "' is on ", t->device().str(), ", the call runs on ",
           ctx.device.str());
  }
}

void expect_dtype(DType dtype, std::string_view op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    if (t->dtype() != dtype)
      fail("kernel ", op, ": tensor '", t->name(), "' holds ", dtype_name(t->dtype()), ", expected ", dtype_name(dtype));
}

void expect_matrix(std::string_view op, const Tensor& t, int64_t rows, int64_t cols) {
  if (t.numel() != rows * cols || (t.dim() > 0 && t.size(-1) != cols))
    fail("kernel ", op, ": tensor '", t.name(), "' has shape ", shape_str(t.shape()), ", expected ", rows, " rows of ",
         cols);
}

void expect_holds(std::string_view op, const Tensor& t, int64_t offset, std::initializer_list<Strided> levels,
                  int64_t len) {
  bool empty = len == 0;
  for (const Strided& l : levels) {
    if (l.count < 0 || l.stride < 0)
      fail("kernel ", op, ": tensor '", t.name(), "' addressed with a negative count or stride (", l.count, ", ",
           l.stride, ")");
    empty = empty || l.count == 0;
  }
  if (offset < 0 || len < 0)
    fail("kernel ", op, ": tensor '", t.name(), "' addressed with a negative offset or length (", offset, ", ", len,
         ")");
  if (empty) return;
  int64_t end = 0, span = 0;  // one past the last element touched
  bool overflow = __builtin_add_overflow(offset, len, &end);
  for (const Strided& l : levels)
    overflow =
        overflow || __builtin_mul_overflow(l.count - 1, l.stride, &span) || __builtin_add_overflow(end, span, &end);
  if (overflow) fail("kernel ", op, ": the shape and strides given for tensor '", t.name(), "' overflow int64");
  if (end > t.numel())
    fail("kernel ", op, ": tensor '", t.name(), "' has ", t.numel(), " elements (shape ", shape_str(t.shape()),
         "), the shape and strides given need ", end);
}

void fail_no_backend(const ExecContext& ctx, std::string_view op) {
#ifdef MEGATON_WITH_CUDA
  fail("kernel ", op, " has no implementation for ", ctx.device.str());
#else
  fail("kernel ", op, " called on ", ctx.device.str(), ", but this Megaton was built without CUDA");
#endif
}

}  // namespace megaton::kernels
