// FP8 KV cache pages (nn/paged_kv_cache.h): each head of each cached token, D values, encoded as
// E4M3 with its own fp32 scale: scale_inv = amax / 448 is stored (0 for an all-zero head) and the
// value at d is code(d) * scale_inv. A per-token, per-head scale follows each token's range, which a
// static per-tensor scale (vLLM's default of 1.0) would not; it costs 4 bytes per D codes.
#pragma once
#include <cstdint>

namespace megaton::kernels::cpu {

// rows heads of D values, src rows src_stride floats apart -> codes rows D bytes apart, scale_inv[row].
void quantize_kv_heads(const float* src, int64_t src_stride, uint8_t* codes, float* scale_inv, int64_t rows,
                       int64_t D);
// The values back: rows of D codes (D bytes apart) -> dst rows dst_stride floats apart.
void dequantize_kv_heads(const uint8_t* codes, const float* scale_inv, float* dst, int64_t dst_stride, int64_t rows,
                         int64_t D);

}  // namespace megaton::kernels::cpu
