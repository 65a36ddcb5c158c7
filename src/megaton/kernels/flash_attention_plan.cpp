#include "megaton/kernels/flash_attention_plan.h"

#include <algorithm>
#include <sstream>

namespace megaton::kernels {

namespace {

constexpr int64_t kGridYZ = 65535;
constexpr size_t kElement = 2;  // bf16 / fp16 bytes

// Bytes of `rows` shared-memory rows of `cols` elements plus the padding.
constexpr size_t tile_bytes(int64_t rows, int64_t cols) { return static_cast<size_t>(rows * (cols + kFlashPad)) * kElement; }

}  // namespace

bool flash_attention_head_dims_supported(HeadDim D) {
  if (D.qk == 192 && D.v == 128) return true;
  return D.qk == D.v && (D.qk == 32 || D.qk == 64 || D.qk == 128 || D.qk == 192);
}

std::string flash_attention_unsupported(DType dtype, HeadDim D, int64_t B, int64_t Hq, int64_t Hkv,
                                        std::initializer_list<int64_t> element_offsets) {
  std::ostringstream why;
  if (dtype != DType::BF16 && dtype != DType::F16)
    why << "flash attention runs bf16 or f16, not " << dtype_name(dtype);
  else if (!flash_attention_head_dims_supported(D))
    why << "flash attention has kernels for head dims 32, 64, 128, 192 and 192 (qk) / 128 (v), not " << D.qk
        << " / " << D.v;
  else if (B > kGridYZ || Hq > kGridYZ || Hkv > kGridYZ)
    why << "flash attention's grid takes at most " << kGridYZ << " batch rows and heads, got B " << B << ", Hq "
        << Hq;
  else
    for (int64_t offset : element_offsets)
      if (offset % 8 != 0) {
        why << "flash attention loads 16-byte vectors: every head offset and stride must be a multiple of 8 elements, got "
            << offset;
        break;
      }
  return why.str();
}

FlashAttentionPlan flash_attention_plan(HeadDim D, int64_t Tlen, int64_t Tk) {
  FlashAttentionPlan p;
  p.dqk = static_cast<int>(D.qk);
  p.dv = static_cast<int>(D.v);
  p.kv_q_tile = flash_kv_q_tile(D.qk, D.v);
  const int64_t q = kFlashQTile, kv = kFlashKvTile, kq = p.kv_q_tile;
  // Forward: K and V tiles, double-buffered (the next loads while this one is multiplied), and the
  // block's Q rows (later its output rows).
  p.forward_smem = 2 * (tile_bytes(kv, D.qk) + tile_bytes(kv, D.v)) + tile_bytes(q, std::max(D.qk, D.v));
  // dq: this block's Q and dO, and double-buffered K and V tiles.
  p.dq_smem = tile_bytes(q, D.qk) + tile_bytes(q, D.v) + 2 * (tile_bytes(kv, D.qk) + tile_bytes(kv, D.v));
  // dk / dv: this block's K and V, and double-buffered Q and dO tiles with their rows' lse and delta (floats).
  p.dkv_smem = tile_bytes(kv, D.qk) + tile_bytes(kv, D.v) +
               2 * (tile_bytes(kq, D.qk) + tile_bytes(kq, D.v) + 2 * static_cast<size_t>(kq) * sizeof(float));
  p.q_blocks = (Tlen + q - 1) / q;
  p.kv_blocks = (Tk + kv - 1) / kv;
  return p;
}

}  // namespace megaton::kernels
