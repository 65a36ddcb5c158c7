// Where the attention heads of each token sit in an activation buffer; shared by rope.h and
// attention.h, so that both read q, k and v in place inside Megatron's fused QKV rows.
#pragma once
#include <cstdint>

namespace megaton::kernels {

// Token (b, t) of a [B, Tlen] batch owns the row starting (b * Tlen + t) * row elements in. Within
// it, head i of query group g (heads are numbered per group) starts at g * group + i * D.
// - Megatron's fused QKV row, one block of [q heads of the group | k | v] per group:
//   {qkv_size, (Hq / Hkv + 2) * D} for q, k and v alike, k and v pointing at their head in block 0.
// - A contiguous [..., H, D] buffer of q (H = Hq) or of k / v (H = Hkv): {H * D, (H / Hkv) * D}.
struct HeadStrides {
  int64_t row;    // elements from one token to the next
  int64_t group;  // elements from one query group's first head to the next group's
};

// Head sizes: q and k heads hold `qk` elements, v heads and the output's heads `v`. The usual
// attention has one size (the implicit conversion from an integer); multi-latent attention has
// qk = nope + rope and v = v_head_dim, and its absorbed decoding qk = kv_lora_rank + rope against
// v = kv_lora_rank (the values are the first columns of the keys).
struct HeadDim {
  HeadDim(int64_t d) : qk(d), v(d) {}  // NOLINT(google-explicit-constructor): one size for all
  HeadDim(int64_t qk_dim, int64_t v_dim) : qk(qk_dim), v(v_dim) {}
  int64_t qk, v;
};

}  // namespace megaton::kernels
