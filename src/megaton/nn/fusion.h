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
//   - layernorm_linear (TE's LayerNormLinear / RMSNormLinear): a norm whose output feeds one linear
//     alone (the attention's qkv, the dense MLP's fc1) writes that linear's input precision
//     directly. Under FP8 only the statistics are written; the quantiser computes the norm's output
//     in f32 block by block and encodes it, so the compute-dtype output (and its rereads for the
//     amax and the two layouts) never exists. In f32 / bf16 the norm already writes the GEMM's
//     dtype: nothing changes. Not under sequence parallelism (the linear gathers the written rows).
//   - layernorm_mlp (TE's LayerNormMLP): norm -> fc1 -> activation -> fc2 with, under FP8, fc2's
//     8-bit input made in fc1's GEMM epilogue: the GEMM hands its output over in stripes of 128
//     rows (computing 512 per oneDNN call), and each stripe's activation (+ fc1's deferred bias) is computed in f32 and
//     quantised into both of fc2's layouts while the stripe is still in cache (the activation's output is never
//     written). oneDNN has no hook for a dynamic-scale FP8 epilogue, so the stripes are the hook. Per-tensor current
//     scaling needs the whole amax before any code, so its epilogue reads the amax and the codes take one more pass
//     over fc1's output; delayed scaling (the scale is known) and the tiled recipes (each tile's scale is its own)
//     encode in the epilogue.
#pragma once

namespace megaton::nn {

struct FusionConfig {
  bool bias_activation = true;
  bool residual_norm = true;
  bool layernorm_linear = true;
  bool layernorm_mlp = true;
};

}  // namespace megaton::nn
