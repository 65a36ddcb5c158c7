#include "megaton/kernels/fp8_quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "megaton/core/error.h"

namespace megaton::kernels {

namespace {

inline float nan_max(float a, float b) {
  return std::isnan(a) || std::isnan(b) ? std::numeric_limits<float>::quiet_NaN() : std::max(a, b);
}

// The input (or its transpose) as f32 rows, bf16 widened exactly, so the tile loops read one type.
std::vector<float> as_float(const Tensor& x, bool transpose) {
  const int64_t rows = x.size(0), cols = x.size(1);
  std::vector<float> v(static_cast<size_t>(x.numel()));
  const float* f32 = x.dtype() == DType::F32 ? x.data<float>() : nullptr;
  const BFloat16* bf16 = f32 ? nullptr : x.data<BFloat16>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const float value = f32 ? f32[i] : bf16_to_float(bf16[i].bits);
      v[static_cast<size_t>(transpose ? c * rows + r : i)] = value;
    }
  return v;
}

}  // namespace

float fp8_scale_from_amax(float amax, float fp8_max, bool pow2, float epsilon) {
  if (amax < epsilon) amax = epsilon;
  if (std::isinf(amax) || amax == 0.0f || std::isnan(amax)) return 1.0f;
  float scale = fp8_max / amax;
  if (std::isinf(scale)) scale = std::numeric_limits<float>::max();
  if (pow2) {
    uint32_t bits;
    std::memcpy(&bits, &scale, sizeof bits);
    bits &= 0xff800000u;  // keep sign and exponent: round down to a power of two
    std::memcpy(&scale, &bits, sizeof bits);
  }
  return scale;
}

uint8_t mx_scale_code(float amax, float fp8_max) { return fp8::e8m0_from_float(amax * (1.0f / fp8_max)); }

Fp8TileShape fp8_tile_shape(Fp8Granularity g, int64_t rows, int64_t cols) {
  switch (g) {
    case Fp8Granularity::Tensor: return {std::max<int64_t>(rows, 1), std::max<int64_t>(cols, 1)};
    case Fp8Granularity::Tile1x128: return {1, 128};
    case Fp8Granularity::Block128x128: return {128, 128};
    case Fp8Granularity::Mx1x32: return {1, 32};
  }
  fail("unknown FP8 granularity");
}

float Fp8Matrix::scale_inv_at(int64_t row, int64_t col) const {
  const Fp8TileShape t = tile();
  const int64_t i = (row / t.rows) * scale_inv.size(1) + col / t.cols;
  return granularity == Fp8Granularity::Mx1x32 ? fp8::e8m0_to_float(static_cast<const uint8_t*>(scale_inv.raw())[i])
                                               : static_cast<const float*>(scale_inv.raw())[i];
}

std::string_view granularity_name(Fp8Granularity g) {
  switch (g) {
    case Fp8Granularity::Tensor: return "tensor";
    case Fp8Granularity::Tile1x128: return "1x128";
    case Fp8Granularity::Block128x128: return "128x128";
    case Fp8Granularity::Mx1x32: return "mx1x32";
  }
  return "?";
}

Fp8Matrix fp8_quantize(const Tensor& x, const Fp8QuantizeOptions& options, const std::string& name) {
  MEGATON_CHECK(x.dim() == 2, "FP8 quantisation of '", x.name(), "' takes a 2-D matrix, got ", shape_str(x.shape()));
  MEGATON_CHECK(x.device().is_cpu() && (x.dtype() == DType::F32 || x.dtype() == DType::BF16),
                "FP8 quantisation of '", x.name(), "' takes f32 or bf16 on the host, got ", dtype_name(x.dtype()),
                " on ", x.device().str());
  MEGATON_CHECK(!options.scale || options.granularity == Fp8Granularity::Tensor,
                "a given FP8 scale applies to per-tensor scaling only, not ", granularity_name(options.granularity));
  MEGATON_CHECK(!options.scale || (std::isfinite(*options.scale) && *options.scale > 0.0f),
                "FP8 scale for '", x.name(), "' must be finite and positive, got ", options.scale.value_or(0.0f));
  const int64_t rows = x.size(options.transpose ? 1 : 0), cols = x.size(options.transpose ? 0 : 1);
  const Fp8TileShape tile = fp8_tile_shape(options.granularity, rows, cols);
  const int64_t tile_rows = (rows + tile.rows - 1) / tile.rows, tile_cols = (cols + tile.cols - 1) / tile.cols;
  const bool mx = options.granularity == Fp8Granularity::Mx1x32;
  const float fp8_max = fp8::info(options.format).max;

  Fp8Matrix q;
  q.granularity = options.granularity;
  q.data = Tensor::empty({rows, cols}, fp8::dtype_of_format(options.format), options.category, name);
  q.scale_inv = Tensor::empty({tile_rows, tile_cols}, mx ? DType::U8 : DType::F32, options.category, name + "_scale_inv");
  const std::vector<float> in = as_float(x, options.transpose);
  // Amax per (row, tile column) in parallel over rows, then per tile over its rows: every
  // granularity, the whole-tensor one included, reads the input once with all threads.
  std::vector<float> row_amax(static_cast<size_t>(rows * tile_cols), 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float& m = row_amax[static_cast<size_t>(r * tile_cols + c / tile.cols)];
      m = nan_max(m, std::fabs(in[static_cast<size_t>(r * cols + c)]));
    }
  std::vector<float> scale(static_cast<size_t>(tile_rows * tile_cols));
  q.amax = 0.0f;
  for (int64_t t = 0; t < tile_rows * tile_cols; ++t) {
    const int64_t tr = t / tile_cols, tc = t % tile_cols;
    float amax = 0.0f;
    for (int64_t r = tr * tile.rows; r < std::min(rows, (tr + 1) * tile.rows); ++r)
      amax = nan_max(amax, row_amax[static_cast<size_t>(r * tile_cols + tc)]);
    q.amax = nan_max(q.amax, amax);
    if (mx) {
      const uint8_t code = mx_scale_code(amax, fp8_max);
      q.scale_inv.data<uint8_t>()[t] = code;
      scale[static_cast<size_t>(t)] =
          code == 0xff ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.0f, 127 - static_cast<int>(code));
    } else {
      scale[static_cast<size_t>(t)] = options.scale ? *options.scale : fp8_scale_from_amax(amax, fp8_max, options.pow2_scales);
      q.scale_inv.data<float>()[t] = 1.0f / scale[static_cast<size_t>(t)];
    }
  }
  auto* out = static_cast<uint8_t*>(q.data.raw());
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      out[i] = fp8::encode(in[i] * scale[static_cast<size_t>((r / tile.rows) * tile_cols + c / tile.cols)], options.format);
    }
  return q;
}

Fp8Matrix fp8_transpose(const Fp8Matrix& q, const std::string& name) {
  MEGATON_CHECK(q.granularity == Fp8Granularity::Tensor || q.granularity == Fp8Granularity::Block128x128,
                "FP8 matrix '", q.data.name(), "' with ", granularity_name(q.granularity),
                " scales cannot be transposed without re-quantising (quantise the source with transpose)");
  const int64_t rows = q.data.size(0), cols = q.data.size(1);
  const int64_t srows = q.scale_inv.size(0), scols = q.scale_inv.size(1);
  Fp8Matrix t;
  t.granularity = q.granularity;
  t.amax = q.amax;
  t.data = Tensor::empty({cols, rows}, q.data.dtype(), q.data.category(), name);
  t.scale_inv = Tensor::empty({scols, srows}, DType::F32, q.scale_inv.category(), name + "_scale_inv");
  const auto* src = static_cast<const uint8_t*>(q.data.raw());
  auto* dst = static_cast<uint8_t*>(t.data.raw());
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) dst[c * rows + r] = src[r * cols + c];
  for (int64_t i = 0; i < srows; ++i)
    for (int64_t j = 0; j < scols; ++j) t.scale_inv.data<float>()[j * srows + i] = q.scale_inv.data<float>()[i * scols + j];
  return t;
}

Tensor fp8_dequantize(const Fp8Matrix& q, MemCategory category) {
  const int64_t rows = q.data.size(0), cols = q.data.size(1);
  Tensor out = Tensor::empty({rows, cols}, DType::F32, category, q.data.name() + "_dequantized");
  const auto* codes = static_cast<const uint8_t*>(q.data.raw());
  const fp8::Format format = q.format();
  float* dst = out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = fp8::decode(codes[r * cols + c], format) * q.scale_inv_at(r, c);
  return out;
}

}  // namespace megaton::kernels
