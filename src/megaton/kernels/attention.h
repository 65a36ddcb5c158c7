// Causal self-attention on tensors, MHA and GQA, flash-style (kernels::cpu, cpu/attention.h): only
// the log-sum-exp per query row is kept for backward. q, k and v are read in place where they lie,
// e.g. inside one fused QKV tensor, or q there and k / v in a KV cache: each is a tensor plus the
// element at which its heads start, addressed by HeadStrides (head_strides.h). Dispatches to
// kernels::cpu (f32 / f64 by the flash kernel; bf16 by GEMMs over blocks of query rows,
// cpu/attention_bf16.h; attention_dtype says which one bf16 training uses) or, for
// attention_forward / attention_backward, kernels::cuda: bf16 / fp16 by
// the tiled flash kernels (cuda/flash_attention.h, flash_attention_plan.h: the head sizes they take,
// 16-byte aligned heads), f32 by a plain warp-per-row kernel (cuda/attention.h); decoding is CPU
// only. lse is f32 when q is bf16 / fp16, else q's dtype.
#pragma once
#include <cstdint>

#include "megaton/kernels/decode_rows.h"
#include "megaton/kernels/exec_context.h"
#include "megaton/kernels/head_strides.h"

namespace megaton::kernels {

// The dtype in which nn/ runs the attention of `activations` (nn/attention.cpp): bf16 stays bf16 on a
// CPU whose bf16 GEMMs are native (oneDNN on AMX / AVX512-BF16, where cpu/attention_bf16.h beats the
// f32 kernel); everything else attends in f32, a 16-bit qkv on an f32 copy: where bf16 GEMMs would be
// emulated through f32 sgemm, and on CUDA until its RoPE takes bf16.
DType attention_dtype(const ExecContext& ctx, DType activations);
// Makes attention_dtype answer f32 for every dtype (on), or restores the rule (off): for comparisons
// with paths that attend in f32, such as decoding over an f32 KV cache. Set it between layers' calls.
void force_f32_attention(bool on);

// A tensor and the element of it at which a set of heads starts: in a fused QKV tensor q, k and v
// are {qkv, 0}, {qkv, k_offset} and {qkv, v_offset}; a tensor alone is {t, 0}. It refers to the
// tensor (like copy.h's BlockAt): a parameter type, built in the call.
struct TensorAt {
  TensorAt(const Tensor& tensor, int64_t at = 0) : t(tensor), offset(at) {}  // implicit: a Tensor is {t, 0}
  const Tensor& t;
  int64_t offset;
};

// q and k heads hold D.qk elements, v heads D.v (head_strides.h; an integer is both).
// out [B*Tlen, Hq*D.v] (contiguous [B, Tlen, Hq, D.v]) and lse [B, Hq, Tlen] are written. Query head h
// belongs to group g = h / (Hq/Hkv) and attends with kv head g. q (and dq) are addressed by q_at
// (head h is head h % (Hq/Hkv) of its group; batch rows Tlen * q_at.row apart), k and v by kv_at
// (one head per group). pos_offset: q token t sits at absolute position pos_offset + t and sees
// keys 0..pos_offset+t, so k / v hold Tk = pos_offset + Tlen tokens per batch row (the KV cache;
// training passes 0). kv_batch_stride: elements between the batch rows of k / v; -1 means
// Tk * kv_at.row (a KV cache with room for more tokens passes capacity * kv_at.row).
// Every tensor must hold the elements its layout reaches; all share one dtype (lse: see above).
void attention_forward(const ExecContext& ctx, const Tensor& out, const Tensor& lse, TensorAt q, TensorAt k, TensorAt v,
                       int64_t B, int64_t Tlen, int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at, HeadStrides kv_at,
                       double scale, int64_t pos_offset = 0, int64_t kv_batch_stride = -1);

// Decode: Tq new query tokens per batch row (1 for a decode step, up to kDecodeRows for a
// speculative verification; decode_rows.h) against the Tk tokens of its KV cache, the new tokens'
// keys and values already appended (cpu/decode_attention.h: one pass over k and v with an online
// softmax, each kv head read once for all the query heads of its group). out [B*Tq, Hq*D] is
// written; q by q_at, k and v by kv_at with batch rows kv_batch_stride elements apart. Equal to
// attention_forward with Tlen Tq and pos_offset Tk - Tq, without the lse; each query has the bits
// it would have as the only one (Tq 1, Tk its prefix); f32 / f64, k and v in q's dtype or bf16
// under f32 q (a bf16 KV cache: f32 math on the widened elements). D as in attention_forward: out
// is [B*Tq, Hq*D.v] (MLA's absorbed decoding: D {R + r, R}, v = k).
void decode_attention(const ExecContext& ctx, const Tensor& out, TensorAt q, TensorAt k, TensorAt v, int64_t B,
                      int64_t Tq, int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at, HeadStrides kv_at, double scale,
                      int64_t Tk, int64_t kv_batch_stride);

// decode_attention over a paged KV cache (vLLM's PagedAttention layout; nn/paged_kv_cache.h):
// k_pages / v_pages [num_pages, page_size, kv cols] with token rows kv_at.row = kv cols apart;
// pages I32 [B, max_pages], row b's page ids in token order; lens I64 [B], the tokens the last of
// row b's Tq queries attends over (its Tq new ones, already written, included), covered by its first
// ceil(lens[b] / page_size) pages. Pages of a multiple of 64 tokens give decode_attention's result
// bitwise. The pages are q's
// dtype, or bf16 or F8E4M3 with f32 q and out (a bf16 / FP8 KV cache: f32 math on the widened
// elements); F8E4M3 pages need k_scale / v_scale, F32 [pages, page_size, Hkv * blocks]: every
// token's head is its codes times its scale (one block, cpu/kv_fp8.h), or split into `blocks` runs
// of D.qk / blocks columns with a scale each (MLA's latent: values within the keys' columns).
void paged_decode_attention(const ExecContext& ctx, const Tensor& out, TensorAt q, const Tensor& k_pages,
                            const Tensor& v_pages, const Tensor& pages, const Tensor& lens, int64_t B, int64_t Tq,
                            int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at, HeadStrides kv_at, double scale,
                            const Tensor& k_scale = {}, const Tensor& v_scale = {});

// dq, dk, dv are written in the layouts of q, k, v (dq by q_at, dk / dv by kv_at), so that they land
// in a fused dQKV tensor; dk / dv sum over the query heads of each group. dout is laid out as out.
// Training only: pos_offset 0, k / v batch rows Tlen * kv_at.row apart.
void attention_backward(const ExecContext& ctx, TensorAt dq, TensorAt dk, TensorAt dv, const Tensor& dout,
                        const Tensor& out, const Tensor& lse, TensorAt q, TensorAt k, TensorAt v, int64_t B,
                        int64_t Tlen, int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at, HeadStrides kv_at,
                        double scale);

}  // namespace megaton::kernels
