#include "megaton/kernels/cpu/kv_fp8.h"

#include <algorithm>
#include <cmath>

#include "megaton/core/fp8_format.h"
#include "megaton/kernels/cpu/gemv_dot.h"
#include "megaton/kernels/fp8_quantize.h"

namespace megaton::kernels::cpu {

void quantize_kv_heads(const float* src, int64_t src_stride, uint8_t* codes, float* scale_inv, int64_t rows,
                       int64_t D) {
  const float fp8_max = fp8::info(fp8::Format::E4M3).max;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = src + r * src_stride;
    float amax = 0;
    for (int64_t d = 0; d < D; ++d) amax = std::max(amax, std::abs(x[d]));
    // The FP8 recipes' scale rule (a subnormal amax saturates the scale rather than overflowing it);
    // an all-zero head keeps scale 0, so it decodes to zeros whatever its codes.
    const float scale = amax > 0 ? fp8_scale_from_amax(amax, fp8_max) : 0.0f;
    scale_inv[r] = amax > 0 ? 1.0f / scale : 0.0f;
    uint8_t* c = codes + r * D;
    for (int64_t d = 0; d < D; ++d) c[d] = fp8::encode_inline<fp8::Format::E4M3>(x[d] * scale);
  }
}

void dequantize_kv_heads(const uint8_t* codes, const float* scale_inv, float* dst, int64_t dst_stride, int64_t rows,
                         int64_t D) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < D; ++d)
      dst[r * dst_stride + d] = gemv_detail::load(Float8E4M3{codes[r * D + d]}) * scale_inv[r];
}

}  // namespace megaton::kernels::cpu
