// Which fused kernels a decoder block runs (the training config's bias_activation_fusion and
// residual_norm_fusion, on by default as in Megatron and TransformerEngine). A fusion computes what
// the unfused composition computes with fewer passes over memory: the forward math is the same and
// the results agree to rounding (bitwise for the residual + norm in f32 and f64).
//   - bias_activation: fc1's GEMM leaves out its bias; the activation adds it (bias + GeLU / SwiGLU)
//     and its backward sums the bias gradient while it writes dh. Saves the GEMM's bias pass and the
//     weight gradient's pass over dh. Only MLPs whose fc1 has a bias (GPT-2 style) change.
//   - residual_norm: the attention's residual add and the pre-MLP norm run as one pass over each row,
//     and both norms' input gradients take the residual gradient as they are written (add + norm
//     and norm backward + add). Saves one read of the sum forward and a read + write of the
//     gradient per norm backward.
#pragma once

namespace megaton::nn {

struct FusionConfig {
  bool bias_activation = true;
  bool residual_norm = true;
};

}  // namespace megaton::nn
