// FP8 quantisation of a row-major matrix [rows, cols] with the scaling granularities of the recipes:
//   Tensor       one scale for the whole tensor (delayed or current scaling);
//   Tile1x128    one scale per 1 x 128 run of a row (DeepSeek-V3's activations and gradients);
//   Block128x128 one scale per 128 x 128 block (DeepSeek-V3's weights);
//   Mx1x32       one power-of-two E8M0 scale per 1 x 32 run of a row (OCP MXFP8).
// Ragged edges form smaller tiles. The data is 8-bit (DType::U8 holding the format's codes), so the
// allocator counts one byte per element; scale_inv is fp32 [scale rows, scale cols], or U8 E8M0 codes
// for Mx1x32. dequantize(quantize(x)) is x rounded to FP8 at the tile's scale.
#pragma once
#include <optional>
#include <string_view>

#include "megaton/core/tensor.h"
#include "megaton/fp8/format.h"

namespace megaton::fp8 {

enum class Granularity : uint8_t { Tensor, Tile1x128, Block128x128, Mx1x32 };
std::string_view granularity_name(Granularity g);

struct QuantizedMatrix {
  Tensor data;       // U8 codes, [rows, cols]
  Tensor scale_inv;  // F32 (or U8 E8M0 for Mx1x32), [scale rows, scale cols]
  Format format = Format::E4M3;
  Granularity granularity = Granularity::Tensor;
  float amax = 0.0f; // of the whole input (NaN if it held one): what delayed scaling records
};

struct QuantizeOptions {
  Format format = Format::E4M3;
  Granularity granularity = Granularity::Tensor;
  // Tensor granularity only: quantise with this given scale (delayed scaling) instead of one
  // computed from the tensor's own amax (current scaling).
  std::optional<float> scale;
  bool pow2_scales = false;  // current / block scales rounded down to powers of two
  MemCategory category = MemCategory::Activations;
};

// x: 2-D, f32 or bf16, on the host.
QuantizedMatrix quantize(const Tensor& x, const QuantizeOptions& options, const std::string& name = "fp8");
// The f32 matrix the codes stand for.
Tensor dequantize(const QuantizedMatrix& q, MemCategory category = MemCategory::Workspace);

}  // namespace megaton::fp8
