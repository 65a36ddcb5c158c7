// CUDA RoPE: rotates f32 q / k heads in place, addressed by HeadStrides exactly as the CPU kernel
// (kernels/rope.h says what the arguments mean; the dispatcher has checked them). The cos / sin
// tables are computed on the host in double, as on the CPU, and copied to the device.
#pragma once
#include "megaton/kernels/exec_context.h"
#include "megaton/kernels/head_strides.h"
#include "megaton/kernels/rope.h"

namespace megaton::kernels::cuda {

void rope_apply(const ExecContext& ctx, const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t B, int64_t Tlen,
                int64_t groups, int64_t H, int64_t D, HeadStrides at, int64_t pos_offset, RopeLayout layout,
                bool inverse);

}  // namespace megaton::kernels::cuda
