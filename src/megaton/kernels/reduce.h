// Whole-tensor reductions with a host-side result: the loss sum, the count of tokens with a
// target, the range check of token / target ids (the first offending index, so the caller's
// error can name it) and the largest magnitude (FP8 delayed scaling's amax). Deterministic for any
// thread count.
#pragma once
#include <optional>

#include "megaton/kernels/exec_context.h"

namespace megaton::kernels {

double sum(const ExecContext& ctx, const Tensor& x);  // f32 / f64 (cpu), f32 / bf16 (cuda); accumulated in double
// max |x| over every element; NaN if x holds one, 0 for an empty tensor. f32 / f64 / bf16 / fp16 (cpu).
float abs_max(const ExecContext& ctx, const Tensor& x);
// ids: i32. Counts ids != value.
int64_t count_not_equal(const ExecContext& ctx, const Tensor& ids, int32_t value);
// ids: i32. Index of the first id outside [0, limit) (and, when given, not equal to `ignore`), or -1.
int64_t first_out_of_range(const ExecContext& ctx, const Tensor& ids, int64_t limit,
                           std::optional<int32_t> ignore = std::nullopt);

}  // namespace megaton::kernels
