#include "megaton/kernels/tokens.h"

#include <algorithm>

namespace megaton::kernels {

void shift_tokens(const ExecContext& ctx, const Tensor& out, const Tensor& ids, int64_t shift, int32_t fill) {
  constexpr std::string_view op = "shift_tokens";
  expect_on_device(ctx, op, {&out, &ids});
  if (ids.dim() != 2 || ids.dtype() != DType::I32 || out.shape() != ids.shape() || out.dtype() != DType::I32)
    fail("kernel ", op, ": '", ids.name(), "' ", shape_str(ids.shape()), " and '", out.name(), "' ",
         shape_str(out.shape()), " must be the same [B, T] i32 shape");
  if (shift < 0) fail("kernel ", op, ": negative shift ", shift);
  if (!ctx.device.is_cpu()) fail_no_backend(ctx, op);
  const int64_t B = ids.size(0), T = ids.size(1), kept = std::max<int64_t>(T - shift, 0);
  const int32_t* in = ids.data<int32_t>();
  int32_t* o = out.data<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    std::copy_n(in + b * T + (T - kept), kept, o + b * T);
    std::fill(o + b * T + kept, o + (b + 1) * T, fill);
  }
}

}  // namespace megaton::kernels
