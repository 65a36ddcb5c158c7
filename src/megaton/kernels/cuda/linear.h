// CUDA linear layer through cuBLASLt. f32, or bf16 inputs with fp32 accumulation (CUBLAS_COMPUTE_32F);
// the weight gradient may accumulate into an fp32 main grad from bf16 inputs. Shapes were checked by
// the dispatcher in kernels/linear.cpp; sizes are passed along.
#pragma once
#include "megaton/kernels/exec_context.h"

namespace megaton::kernels::cuda {

void linear_forward(const ExecContext& ctx, const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
                    int64_t rows, int64_t in, int64_t out_f);
void linear_backward_input(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& w,
                           int64_t rows, int64_t in, int64_t out_f);
void linear_backward_weight(const ExecContext& ctx, const Tensor& dw, const Tensor& dbias, const Tensor& dout,
                            const Tensor& x, int64_t rows, int64_t in, int64_t out_f);

// dbias[C] += sum over rows of dout[rows, C] (fp32 accumulation; dbias f32, dout f32 or bf16).
void bias_grad(const ExecContext& ctx, const Tensor& dbias, const Tensor& dout, int64_t rows, int64_t C);

}  // namespace megaton::kernels::cuda
