// Causal self-attention on pointers, MHA and GQA, computed flash-style: online softmax over key
// blocks, and only the log-sum-exp per query row is kept for backward (no T x T matrix is ever
// stored). float (training, inference) and double (the finite-difference gradient checks).
#pragma once
#include <cstdint>

#include "megaton/kernels/head_strides.h"

namespace megaton::kernels::cpu {

// Layouts: query head h belongs to query group g = h / (Hq/Hkv) and attends with kv head g; q is
// addressed by q_at (head h is head h % (Hq/Hkv) of its group), k and v by kv_at (one head per
// group), so q/k/v may live inside one fused QKV buffer (see head_strides.h). q and k heads hold
// D.qk elements, v heads D.v; out is contiguous [B, Tlen, Hq, D.v]; lse is [B, Hq, Tlen].
// pos_offset: q token t sits at absolute position pos_offset + t and sees keys 0..pos_offset+t
// (k/v then hold Tk = pos_offset + Tlen tokens per batch row; used by the KV cache). Training
// passes 0. kv_batch_stride: elements between batch rows of k/v; -1 means Tk * kv_at.row (a KV
// cache with room for more tokens passes its capacity * kv_at.row).
template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, int64_t B, int64_t Tlen, int64_t Hq,
                       int64_t Hkv, HeadDim D, HeadStrides q_at, HeadStrides kv_at, double scale,
                       int64_t pos_offset = 0, int64_t kv_batch_stride = -1);

// Gradients written at the same places as q/k/v (so they land in a fused dQKV buffer).
// dk/dv sum over the query heads of each group. pos_offset is 0 (training only).
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q, const T* k,
                        const T* v, int64_t B, int64_t Tlen, int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at,
                        HeadStrides kv_at, double scale);

}  // namespace megaton::kernels::cpu
