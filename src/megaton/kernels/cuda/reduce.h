// CUDA whole-tensor reductions with a host-side result (see kernels/reduce.h). Each block reduces
// one fixed chunk of elements with a fixed tree and writes one partial; the host combines the
// partials in chunk order. No atomics: the result does not depend on scheduling (deterministic).
// Each call synchronises ctx's stream to read the partials back.
#pragma once
#include <optional>

#include "megaton/kernels/exec_context.h"

namespace megaton::kernels::cuda {

double sum(const ExecContext& ctx, const Tensor& x);  // f32 or bf16, accumulated in double
int64_t count_not_equal(const ExecContext& ctx, const Tensor& ids, int32_t value);
int64_t first_out_of_range(const ExecContext& ctx, const Tensor& ids, int64_t limit, std::optional<int32_t> ignore);

}  // namespace megaton::kernels::cuda
