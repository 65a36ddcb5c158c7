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

void fail_no_backend(const ExecContext& ctx, std::string_view op) {
#ifdef MEGATON_WITH_CUDA
  fail("kernel ", op, " has no implementation for ", ctx.device.str());
#else
  fail("kernel ", op, " called on ", ctx.device.str(), ", but this Megaton was built without CUDA");
#endif
}

}  // namespace megaton::kernels
