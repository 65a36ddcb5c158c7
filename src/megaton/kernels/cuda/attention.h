// CUDA causal attention, f32, with the CPU kernel's layouts and semantics (kernels/attention.h: MHA
// and GQA, q / k / v read in place through HeadStrides, HeadDim{qk, v}, pos_offset and a KV cache's
// batch stride, lse [B, Hq, Tlen] kept for backward; the dispatcher has checked every extent). A
// first, plain kernel: one warp per query row (forward, dq) or per key row of a kv head (dk, dv
// summed over the group's query heads, no atomics, deterministic), an online softmax over the keys,
// the head dimension spread over the lanes (D <= 256). Not yet the tiled flash kernel the GPU wants
// for speed; it is the reference the tiled one will be checked against.
#pragma once
#include "megaton/kernels/attention.h"

namespace megaton::kernels::cuda {

void attention_forward(const ExecContext& ctx, const Tensor& out, const Tensor& lse, TensorAt q, TensorAt k,
                       TensorAt v, int64_t B, int64_t Tlen, int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at,
                       HeadStrides kv_at, double scale, int64_t pos_offset, int64_t kv_batch_stride);
void attention_backward(const ExecContext& ctx, TensorAt dq, TensorAt dk, TensorAt dv, const Tensor& dout,
                        const Tensor& out, const Tensor& lse, TensorAt q, TensorAt k, TensorAt v, int64_t B,
                        int64_t Tlen, int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at, HeadStrides kv_at,
                        double scale);

}  // namespace megaton::kernels::cuda
