// The host-side decisions of the CUDA flash attention (cuda/flash_attention.cu), kept out of
// kernels/cuda/ so that they compile and are unit-tested on machines without a GPU: which inputs
// the tiled bf16 / fp16 kernels take, their tile sizes, grids and shared memory.
//
// The kernels (FlashAttention-2's algorithm on mma.sync m16n8k16 tensor cores, fp32 accumulation
// and softmax statistics): a block of 4 warps owns 64 query rows (16 per warp) and walks the key
// tiles of 64 up to the causal limit with an online softmax; lse is kept in f32. Backward is
// deterministic, without atomics: one kernel per 64 query rows computes dq (S and dP recomputed),
// one per 64 keys of a kv head computes dk and dv summed over the group's query heads (GQA).
// Tiles are staged row-major in shared memory by cp.async, the streamed ones double-buffered, and
// read into fragments by ldmatrix (transposing where an operand runs along the other axis); rows
// are padded by 8 elements so that the 8 rows of an 8x8 matrix fall in different banks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "megaton/core/dtype.h"
#include "megaton/kernels/head_strides.h"

namespace megaton::kernels {

inline constexpr int kFlashQTile = 64;   // query rows per forward / dq block: 4 warps of 16
inline constexpr int kFlashKvTile = 64;  // keys per forward / dq step, and per dk / dv block
inline constexpr int kFlashPad = 8;      // elements of padding per shared-memory row

// Query rows per dk / dv step: the kernel holds dk and dv accumulators (dqk / 2 + dv / 2 floats a
// thread) besides S and dP (rows / 2 floats each), so wide heads take 32 rows to stay within 255 registers.
constexpr int flash_kv_q_tile(int64_t dqk, int64_t dv) { return dqk + dv <= 256 ? 64 : 32; }

struct FlashAttentionPlan {
  int dqk = 0, dv = 0;
  int kv_q_tile = 0;  // flash_kv_q_tile
  size_t forward_smem = 0, dq_smem = 0, dkv_smem = 0;  // dynamic shared memory, bytes
  int64_t q_blocks = 0, kv_blocks = 0;                 // grid x: tiles of queries (forward, dq) and of keys (dk / dv)
};

// The head sizes with an instantiated kernel: {32, 32}, {64, 64}, {128, 128}, {192, 192} and
// DeepSeek-V3's MLA {192, 128}.
bool flash_attention_head_dims_supported(HeadDim D);

// Why the flash kernels cannot take this attention; empty when they can. dtype must be bf16 or f16;
// `element_offsets` are every offset and stride (in elements) the kernels add to the tensors' base
// addresses, which must be multiples of 8 so that tiles load as 16-byte vectors; Tk tokens of keys
// and B, Hq and Hkv must fit the grid (y = heads, z = batch rows, at most 65535 each).
std::string flash_attention_unsupported(DType dtype, HeadDim D, int64_t B, int64_t Hq, int64_t Hkv,
                                        std::initializer_list<int64_t> element_offsets);

// Tile sizes, shared memory and grids for Tlen query rows against Tk keys (training: Tk = Tlen).
FlashAttentionPlan flash_attention_plan(HeadDim D, int64_t Tlen, int64_t Tk);

}  // namespace megaton::kernels
