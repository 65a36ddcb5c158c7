// Attention of the new tokens of each sequence over its KV cache (decode: one token; speculative
// verification: a few), MHA and GQA, in one pass with an online softmax: the keys and values of
// each kv group are read once, in blocks, for all the query heads of that group, and nothing of
// size Tk is kept but one block of scores. Every query is computed on its own, in the same order
// whatever Tq is: query t of a Tq-token call has the bits of a one-token call over its prefix.
#pragma once
#include <cstdint>

#include "megaton/kernels/head_strides.h"

namespace megaton::kernels::cpu {

// out[b*Tq + i, h*D.v + d] (contiguous [B*Tq, Hq, D.v]) = softmax_t(scale q_{b,i,h} . k_{b,g,t})
// v_{b,g,t} over the first Tk - (Tq - 1 - i) cached tokens t (the Tq new ones included: query i sees
// itself and what precedes it), g = h / (Hq/Hkv); q and k heads hold D.qk elements, v heads D.v
// (MLA's absorbed decoding: keys [c | k_rope], values c, the keys' first columns). q holds Tq
// tokens per batch row, addressed by q_at (token rows q_at.row apart); k and v by kv_at (token t of
// row b at b * kv_batch_stride + t * kv_at.row + g * kv_at.group). float or double; KV is T, or bf16
// under float (a bf16 cache: each element widened as it is read).
template <typename T, typename KV>
void decode_attention(T* out, const T* q, const KV* k, const KV* v, int64_t B, int64_t Tq, int64_t Hq, int64_t Hkv,
                      HeadDim D, HeadStrides q_at, HeadStrides kv_at, double scale, int64_t Tk,
                      int64_t kv_batch_stride);

// The same over a paged cache (vLLM's PagedAttention layout): k_pages / v_pages hold pages of
// page_size tokens, token t of batch row b in page pages[b * max_pages + t / page_size] at slot
// t % page_size (token rows kv_at.row apart, pages page_size rows apart), and the last of row b's
// Tq queries attends over its lens[b] tokens. Pages of a multiple of 64 tokens give decode_attention's sums exactly.
// KV: T, or bf16 or E4M3 pages under f32 math (half or a quarter of the cache's bytes; each element
// widened as it is read). E4M3 pages come with k_scale / v_scale [pages, page_size, Hkv *
// scale_blocks]: each token's head is split into scale_blocks runs of D.qk / scale_blocks columns,
// each its codes x its scale (cpu/kv_fp8.h); one block is the whole head (and its D.v values); more
// (MLA's latent, whose values are its keys' first D.v columns) need D.v <= D.qk. Null otherwise.
template <typename T, typename KV>
void paged_decode_attention(T* out, const T* q, const KV* k_pages, const KV* v_pages, int64_t B, int64_t Tq, int64_t Hq,
                            int64_t Hkv, HeadDim D, HeadStrides q_at, HeadStrides kv_at, double scale,
                            const int32_t* pages, int64_t max_pages, const int64_t* lens, int64_t page_size,
                            const float* k_scale = nullptr, const float* v_scale = nullptr, int64_t scale_blocks = 1);

}  // namespace megaton::kernels::cpu
