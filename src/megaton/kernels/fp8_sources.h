// Fused producers for the FP8 quantiser (kernels/fp8_quantize.h's Fp8Source): the values of an op's
// output computed in f32 for each block the quantiser asks for, never written in the compute dtype.
// They are TransformerEngine's fused casts, on the CPU:
//   norm_statistics + norm_fp8_source   LayerNormLinear / RMSNormLinear: the norm writes the GEMM's
//                                       FP8 input directly;
//   activation_fp8_source               LayerNormMLP: fc2's FP8 input straight from fc1's output
//                                       (GeLU or SwiGLU, + fc1's deferred bias).
// Each computes exactly what its unfused kernel computes before rounding to the compute dtype (the
// same loop), so in f32 the fused codes are bitwise the unfused ones; in bf16 they skip one
// rounding. Sources hold their tensors, so they stay valid as long as they are held. CPU only;
// f32 or bf16 activations.
#pragma once
#include "megaton/kernels/exec_context.h"
#include "megaton/kernels/fp8_quantize.h"

namespace megaton::kernels {

// The statistics a norm's forward saves, without its output: rstd [N], and mean [N] for LayerNorm
// (undefined for RMSNorm); when residual is defined, sum = x + residual is written first and the
// statistics are the sum's (add_layernorm_forward / add_rmsnorm_forward's fused residual; sum may be
// x or residual).
void norm_statistics(const ExecContext& ctx, const Tensor& sum, const Tensor& mean, const Tensor& rstd,
                     const Tensor& x, const Tensor& residual, double eps);
// The norm's output (x - mean) * rstd * weight + bias from its input (the sum, under a fused
// residual) and those statistics; mean and bias undefined for RMSNorm.
Fp8Source norm_fp8_source(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                          const Tensor& bias, const std::string& name);
// GeLU(h + bias) on h [N, F], or SwiGLU on [gate | up] h [N, 2F] (+ bias [2F]): [N, F]. bias may be
// undefined; when defined it is f32.
Fp8Source activation_fp8_source(const Tensor& h, const Tensor& bias, bool swiglu, const std::string& name);

}  // namespace megaton::kernels
