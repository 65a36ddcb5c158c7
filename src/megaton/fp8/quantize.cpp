#include "megaton/fp8/quantize.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "megaton/core/error.h"
#include "megaton/fp8/scaling.h"

namespace megaton::fp8 {

namespace {

struct TileShape {
  int64_t rows, cols;
};

TileShape tile_shape(Granularity g, int64_t rows, int64_t cols) {
  switch (g) {
    case Granularity::Tensor: return {std::max<int64_t>(rows, 1), std::max<int64_t>(cols, 1)};
    case Granularity::Tile1x128: return {1, 128};
    case Granularity::Block128x128: return {128, 128};
    case Granularity::Mx1x32: return {1, 32};
  }
  fail("unknown FP8 granularity");
}

inline float nan_max(float a, float b) {
  return std::isnan(a) || std::isnan(b) ? std::numeric_limits<float>::quiet_NaN() : std::max(a, b);
}

// The input as f32 rows (bf16 widened exactly), so the tile loops read one type.
std::vector<float> as_float(const Tensor& x) {
  std::vector<float> v(static_cast<size_t>(x.numel()));
  if (x.dtype() == DType::F32) {
    std::copy_n(x.data<float>(), v.size(), v.begin());
  } else {
    const BFloat16* p = x.data<BFloat16>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_float(p[i].bits);
  }
  return v;
}

}  // namespace

std::string_view granularity_name(Granularity g) {
  switch (g) {
    case Granularity::Tensor: return "tensor";
    case Granularity::Tile1x128: return "1x128";
    case Granularity::Block128x128: return "128x128";
    case Granularity::Mx1x32: return "mx1x32";
  }
  return "?";
}

QuantizedMatrix quantize(const Tensor& x, const QuantizeOptions& options, const std::string& name) {
  MEGATON_CHECK(x.dim() == 2, "FP8 quantisation of '", x.name(), "' takes a 2-D matrix, got ", shape_str(x.shape()));
  MEGATON_CHECK(x.device().is_cpu() && (x.dtype() == DType::F32 || x.dtype() == DType::BF16),
                "FP8 quantisation of '", x.name(), "' takes f32 or bf16 on the host, got ", dtype_name(x.dtype()),
                " on ", x.device().str());
  MEGATON_CHECK(!options.scale || options.granularity == Granularity::Tensor,
                "a given FP8 scale applies to per-tensor scaling only, not ", granularity_name(options.granularity));
  MEGATON_CHECK(!options.scale || (std::isfinite(*options.scale) && *options.scale > 0.0f),
                "FP8 scale for '", x.name(), "' must be finite and positive, got ", options.scale.value_or(0.0f));
  const int64_t rows = x.size(0), cols = x.size(1);
  const TileShape tile = tile_shape(options.granularity, rows, cols);
  const int64_t tile_rows = (rows + tile.rows - 1) / tile.rows, tile_cols = (cols + tile.cols - 1) / tile.cols;
  const bool mx = options.granularity == Granularity::Mx1x32;
  const float fp8_max = info(options.format).max;

  QuantizedMatrix q;
  q.format = options.format;
  q.granularity = options.granularity;
  q.data = Tensor::empty({rows, cols}, DType::U8, options.category, name);
  q.scale_inv = Tensor::empty({tile_rows, tile_cols}, mx ? DType::U8 : DType::F32, options.category, name + "_scale_inv");
  const std::vector<float> in = as_float(x);
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
      scale[static_cast<size_t>(t)] = options.scale ? *options.scale : scale_from_amax(amax, fp8_max, options.pow2_scales);
      q.scale_inv.data<float>()[t] = 1.0f / scale[static_cast<size_t>(t)];
    }
  }
  uint8_t* out = q.data.data<uint8_t>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      out[i] = encode(in[i] * scale[static_cast<size_t>((r / tile.rows) * tile_cols + c / tile.cols)], options.format);
    }
  return q;
}

Tensor dequantize(const QuantizedMatrix& q, MemCategory category) {
  const int64_t rows = q.data.size(0), cols = q.data.size(1);
  const TileShape tile = tile_shape(q.granularity, rows, cols);
  const int64_t tile_cols = q.scale_inv.size(1);
  Tensor out = Tensor::empty({rows, cols}, DType::F32, category, q.data.name() + "_dequantized");
  const uint8_t* codes = q.data.data<uint8_t>();
  float* dst = out.data<float>();
  const bool mx = q.granularity == Granularity::Mx1x32;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t t = (r / tile.rows) * tile_cols + c / tile.cols;
      const float scale_inv = mx ? e8m0_to_float(q.scale_inv.data<uint8_t>()[t]) : q.scale_inv.data<float>()[t];
      dst[r * cols + c] = decode(codes[r * cols + c], q.format) * scale_inv;
    }
  return out;
}

}  // namespace megaton::fp8
