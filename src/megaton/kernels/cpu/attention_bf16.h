// Causal self-attention on bf16 q, k and v with fp32 softmax statistics, for bf16 training on CPUs
// that multiply bf16 natively (AMX, AVX512-BF16). Every product is one cpu::gemm over a block of
// query rows and all the keys they see (oneDNN's matmul: bf16 operands, fp32 accumulation), instead
// of the f32 kernel's 64 x 64 register tiles (cpu/attention.h) on a widened copy: on an AMX core the
// f32 kernel runs at ~0.05 TFLOP/s, a twentieth of the ~1 TFLOP/s oneDNN's bf16 GEMMs reach there.
// What remains is mostly the softmax's exponentials (docs/performance.md, "bf16 attention on AMX").
//
// Arguments and layouts as cpu::attention_forward / attention_backward (head_strides.h), with lse
// [B, Hq, Tlen] in f32. As FlashAttention does on GPUs, the probabilities (forward) and dS
// (backward) are rounded to bf16 as the operand of the following GEMM; the row max, the sum of
// exponentials, lse, rowsum(dO * O) and the dK / dV sums over a query group stay in fp32, and each
// output is rounded to bf16 once. Causal masking is exact: the masked probabilities are zero.
#pragma once
#include <cstdint>

#include "megaton/core/dtype.h"
#include "megaton/kernels/head_strides.h"

namespace megaton::kernels::cpu {

void attention_forward_bf16(BFloat16* out, float* lse, const BFloat16* q, const BFloat16* k, const BFloat16* v,
                            int64_t B, int64_t Tlen, int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at,
                            HeadStrides kv_at, double scale, int64_t pos_offset = 0, int64_t kv_batch_stride = -1);

// Training only: pos_offset 0, k / v batch rows Tlen * kv_at.row apart.
void attention_backward_bf16(BFloat16* dq, BFloat16* dk, BFloat16* dv, const BFloat16* dout, const BFloat16* out,
                             const float* lse, const BFloat16* q, const BFloat16* k, const BFloat16* v, int64_t B,
                             int64_t Tlen, int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at, HeadStrides kv_at,
                             double scale);

}  // namespace megaton::kernels::cpu
