// CUDA flash attention for bf16 / fp16 tensors: the tiled tensor-core kernels of
// kernels/flash_attention_plan.h (FlashAttention-2's algorithm, fp32 accumulation, deterministic
// backward), with the layouts and semantics of kernels/attention.h (MHA and GQA, q / k / v in place
// through HeadStrides, a KV cache's pos_offset and batch stride in the forward). lse is f32. The
// dispatcher has checked every extent and flash_attention_unsupported().
#pragma once
#include "megaton/kernels/attention.h"

namespace megaton::kernels::cuda {

void flash_attention_forward(const ExecContext& ctx, const Tensor& out, const Tensor& lse, TensorAt q, TensorAt k,
                             TensorAt v, int64_t B, int64_t Tlen, int64_t Hq, int64_t Hkv, HeadDim D,
                             HeadStrides q_at, HeadStrides kv_at, double scale, int64_t pos_offset,
                             int64_t kv_batch_stride);
void flash_attention_backward(const ExecContext& ctx, TensorAt dq, TensorAt dk, TensorAt dv, const Tensor& dout,
                              const Tensor& out, const Tensor& lse, TensorAt q, TensorAt k, TensorAt v, int64_t B,
                              int64_t Tlen, int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at, HeadStrides kv_at,
                              double scale);

}  // namespace megaton::kernels::cuda
