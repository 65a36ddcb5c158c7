#include "megaton/kernels/fp8_quantize.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "megaton/core/error.h"
#ifdef MEGATON_WITH_CUDA
#include "megaton/kernels/cuda/fp8_quantize.h"
#endif

namespace megaton::kernels {

namespace {

inline float nan_max(float a, float b) {
  return std::isnan(a) || std::isnan(b) ? std::numeric_limits<float>::quiet_NaN() : std::max(a, b);
}

// Blocks the quantiser reads its source in: multiples of every tile's extent in both layouts
// (1, 32 and 128 along either dimension), so each tile lies inside one block.
constexpr int64_t kBlockRows = 128, kBlockCols = 512;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One output layout of a quantisation: the source as it is (rowwise) or transposed (columnwise),
// with its granularity's tiles cut from the layout's own rows.
struct Layout {
  Fp8Matrix* out;
  bool transposed;
  int64_t tile_rows, tile_cols;  // a tile's extent in the source's coordinates
  int64_t scale_cols;            // of the layout's scale grid
};

Layout make_layout(Fp8Matrix& q, const Fp8QuantizeOptions& o, bool transposed, int64_t rows, int64_t cols,
                   const std::string& name) {
  // The layout's own shape: [cols, rows] when transposed.
  const int64_t lr = transposed ? cols : rows, lc = transposed ? rows : cols;
  const Fp8TileShape t = fp8_tile_shape(o.granularity, lr, lc);
  const bool mx = o.granularity == Fp8Granularity::Mx1x32;
  q.granularity = o.granularity;
  q.data = Tensor::empty({lr, lc}, fp8::dtype_of_format(o.format), o.category, name);
  q.scale_inv = Tensor::empty({ceil_div(lr, t.rows), ceil_div(lc, t.cols)}, mx ? DType::U8 : DType::F32, o.category,
                              name + "_scale_inv");
  return transposed ? Layout{&q, true, t.cols, t.rows, q.scale_inv.size(1)}
                    : Layout{&q, false, t.rows, t.cols, q.scale_inv.size(1)};
}

// The scale of a tile with this amax, its scale_inv stored at index `at` of the layout's grid.
float tile_scale(const Layout& l, int64_t at, float amax, const Fp8QuantizeOptions& o, float fp8_max) {
  if (l.out->granularity == Fp8Granularity::Mx1x32) {
    const uint8_t code = mx_scale_code(amax, fp8_max);
    l.out->scale_inv.data<uint8_t>()[at] = code;
    return code == 0xff ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.0f, 127 - static_cast<int>(code));
  }
  const float scale = o.scale ? *o.scale : fp8_scale_from_amax(amax, fp8_max, o.pow2_scales);
  l.out->scale_inv.data<float>()[at] = 1.0f / scale;
  return scale;
}

// max |p[i * stride]| over n values, NaN if any is: a vectorised max with the NaNs counted aside.
float strided_amax(const float* p, int64_t n, int64_t stride) {
  float m = 0.0f;
  bool nan = false;
#pragma omp simd reduction(max : m) reduction(|| : nan)
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(p[i * stride]);
    m = a > m ? a : m;
    nan = nan || a != a;
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

// The largest |value| of rows [0, h) x columns [0, w) of buf (row stride ld).
float rect_amax(const float* buf, int64_t ld, int64_t h, int64_t w) {
  float m = 0.0f;
  for (int64_t r = 0; r < h; ++r) m = nan_max(m, strided_amax(buf + r * ld, w, 1));
  return m;
}

// dst[i * dst_stride] = code of src[i * src_stride] * scale, for n values.
template <fp8::Format F>
void encode_run(uint8_t* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t n, float scale) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i * dst_stride] = fp8::encode_inline<F>(src[i * src_stride] * scale);
}

// Rows [r0, r1) x columns [c0, c1) of the source, held in buf (row stride ld), encoded into one
// layout: tile by tile, or all at `tensor_scale` for per-tensor granularity. Runs go along the
// layout's rows, so the codes are stored contiguously.
template <fp8::Format F>
void encode_block(const Layout& l, const float* buf, int64_t ld, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                  int64_t rows, int64_t cols, const Fp8QuantizeOptions& o, float fp8_max, float tensor_scale) {
  auto* codes = static_cast<uint8_t*>(l.out->data.raw());
  const bool per_tensor = l.out->granularity == Fp8Granularity::Tensor;
  for (int64_t tr = r0; tr < r1; tr += l.tile_rows)
    for (int64_t tc = c0; tc < c1; tc += l.tile_cols) {
      const int64_t er = std::min(r1, tr + l.tile_rows), ec = std::min(c1, tc + l.tile_cols);
      const float* tile = buf + (tr - r0) * ld + (tc - c0);
      float scale = tensor_scale;
      if (!per_tensor) {
        const float amax = rect_amax(tile, ld, er - tr, ec - tc);
        const int64_t grid_r = tr / l.tile_rows, grid_c = tc / l.tile_cols;
        scale = tile_scale(l, l.transposed ? grid_c * l.scale_cols + grid_r : grid_r * l.scale_cols + grid_c, amax, o,
                           fp8_max);
      }
      if (l.transposed)
        for (int64_t c = tc; c < ec; ++c) encode_run<F>(codes + c * rows + tr, 1, tile + (c - tc), ld, er - tr, scale);
      else
        for (int64_t r = tr; r < er; ++r) encode_run<F>(codes + r * cols + tc, 1, tile + (r - tr) * ld, 1, ec - tc, scale);
    }
}

// Runs body(r0, r1, c0, c1, buf, ld) on every block of the source with the block filled, blocks
// spread over threads, one buffer per thread; returns the largest |value| seen (NaN if any was).
template <typename Body>
float for_each_block(const Fp8Source& src, Body body) {
  const int64_t block_rows = ceil_div(src.rows, kBlockRows), block_cols = ceil_div(src.cols, kBlockCols);
  const int64_t blocks = block_rows * block_cols;
  std::vector<float> block_amax(static_cast<size_t>(blocks), 0.0f);
#pragma omp parallel
  {
    std::vector<float> buf(static_cast<size_t>(kBlockRows * kBlockCols));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r0 = b / block_cols * kBlockRows, c0 = b % block_cols * kBlockCols;
      const int64_t r1 = std::min(src.rows, r0 + kBlockRows), c1 = std::min(src.cols, c0 + kBlockCols);
      const int64_t ld = c1 - c0;
      src.fill(r0, r1, c0, c1, buf.data(), ld);
      block_amax[static_cast<size_t>(b)] = rect_amax(buf.data(), ld, r1 - r0, ld);
      body(r0, r1, c0, c1, buf.data(), ld);
    }
  }
  float amax = 0.0f;
  for (float m : block_amax) amax = nan_max(amax, m);
  return amax;
}

// The layouts asked for (rowwise and / or columnwise) from one pass over the source; a second,
// earlier pass reads the amax when a per-tensor scale is not given.
void quantize_layouts(const Fp8Source& src, const Fp8QuantizeOptions& o, Fp8Matrix* rowwise, Fp8Matrix* columnwise,
                      const std::string& row_name, const std::string& column_name) {
  check_fp8_quantize_options(src.name, o);
  const float fp8_max = fp8::info(o.format).max;
  std::vector<Layout> layouts;
  if (rowwise) layouts.push_back(make_layout(*rowwise, o, false, src.rows, src.cols, row_name));
  if (columnwise) layouts.push_back(make_layout(*columnwise, o, true, src.rows, src.cols, column_name));
  float tensor_scale = 0.0f;
  if (o.granularity == Fp8Granularity::Tensor) {
    const float amax = o.scale ? 0.0f : for_each_block(src, [](auto...) {});
    for (const Layout& l : layouts)  // an empty matrix has an empty scale grid
      tensor_scale = l.out->scale_inv.numel() > 0 ? tile_scale(l, 0, amax, o, fp8_max) : 1.0f;
  }
  const float amax = for_each_block(src, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1, const float* buf, int64_t ld) {
    for (const Layout& l : layouts)
      (o.format == fp8::Format::E4M3 ? encode_block<fp8::Format::E4M3> : encode_block<fp8::Format::E5M2>)(
          l, buf, ld, r0, r1, c0, c1, src.rows, src.cols, o, fp8_max, tensor_scale);
  });
  for (const Layout& l : layouts) l.out->amax = amax;
}

}  // namespace

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

void check_fp8_quantize_options(const std::string& name, const Fp8QuantizeOptions& options) {
  MEGATON_CHECK(!options.scale || options.granularity == Fp8Granularity::Tensor,
                "a given FP8 scale applies to per-tensor scaling only, not ", granularity_name(options.granularity));
  MEGATON_CHECK(!options.scale || (std::isfinite(*options.scale) && *options.scale > 0.0f),
                "FP8 scale for '", name, "' must be finite and positive, got ", options.scale.value_or(0.0f));
}

Fp8Matrix Fp8Matrix::to(Device device, MemCategory category) const {
  Fp8Matrix m = *this;
  m.data = data.to(device, category);
  m.scale_inv = scale_inv.to(device, category);
  return m;
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

Fp8Source fp8_source(const Tensor& x) {
  MEGATON_CHECK(x.dim() == 2, "FP8 quantisation of '", x.name(), "' takes a 2-D matrix, got ", shape_str(x.shape()));
  MEGATON_CHECK(x.device().is_cpu() && (x.dtype() == DType::F32 || x.dtype() == DType::BF16),
                "FP8 quantisation of '", x.name(), "' takes f32 or bf16 on the host, got ", dtype_name(x.dtype()),
                " on ", x.device().str());
  const int64_t cols = x.size(1);
  const bool is_f32 = x.dtype() == DType::F32;
  const float* f32 = is_f32 ? x.data<float>() : nullptr;
  const BFloat16* bf16 = is_f32 ? nullptr : x.data<BFloat16>();
  // The lambda holds x, so its storage lives as long as the source.
  return {x.size(0), cols, x.name(),
          [x, is_f32, f32, bf16, cols](int64_t r0, int64_t r1, int64_t c0, int64_t c1, float* out, int64_t ld) {
            for (int64_t r = r0; r < r1; ++r)
              for (int64_t c = c0; c < c1; ++c)
                out[(r - r0) * ld + (c - c0)] = is_f32 ? f32[r * cols + c] : bf16_to_float(bf16[r * cols + c].bits);
          }};
}

Fp8Matrix fp8_quantize(const Tensor& x, const Fp8QuantizeOptions& options, const std::string& name) {
  if (x.device().is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::fp8_quantize(x, options, name);
#else
    fail("FP8 quantisation of '", x.name(), "' on ", x.device().str(), ": this build has no CUDA backend");
#endif
  }
  return fp8_quantize(fp8_source(x), options, name);
}

Fp8Matrix fp8_quantize(const Fp8Source& x, const Fp8QuantizeOptions& options, const std::string& name) {
  Fp8Matrix q;
  quantize_layouts(x, options, options.transpose ? nullptr : &q, options.transpose ? &q : nullptr, name, name);
  return q;
}

Fp8Layouts fp8_quantize_both(const Fp8Source& x, const Fp8QuantizeOptions& options, const std::string& row_name,
                             const std::string& column_name) {
  MEGATON_CHECK(!options.transpose, "fp8_quantize_both of '", x.name, "' writes both layouts; transpose is not an option");
  Fp8Layouts q;
  quantize_layouts(x, options, &q.rowwise, &q.columnwise, row_name, column_name);
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
