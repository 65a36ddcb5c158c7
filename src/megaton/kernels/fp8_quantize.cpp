#include "megaton/kernels/fp8_quantize.h"

#include <algorithm>
#include <array>
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
// (1, 32 and 128 along either dimension), so each tile lies inside one block; a stripe is a row of
// blocks.
constexpr int64_t kBlockRows = kFp8StripeRows, kBlockCols = 512;

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

// out[c] = max |buf[r * ld + c]| over rows [0, h), for columns [0, w), NaN where one is: a sweep along
// the rows, vectorised across the columns (a NaN, once stored, stays: a > NaN is false).
void column_amax(const float* buf, int64_t ld, int64_t h, int64_t w, float* out) {
  std::fill(out, out + w, 0.0f);
  for (int64_t r = 0; r < h; ++r) {
    const float* row = buf + r * ld;
#pragma omp simd
    for (int64_t c = 0; c < w; ++c) {
      const float a = std::fabs(row[c]), m = out[c];
      out[c] = a > m || a != a ? a : m;
    }
  }
}

// The largest |value| of rows [0, h) x columns [0, w) of buf (row stride ld), NaN if one is: runs
// of 16 columns swept into 16 lanes by column_amax (whose loop vectorises, where a max-reduction
// with a NaN flag did not), then the lanes and the ragged columns.
float rect_amax(const float* buf, int64_t ld, int64_t h, int64_t w) {
  constexpr int64_t kLanes = 16;
  std::array<float, kLanes> lanes{}, part;
  for (int64_t c0 = 0; c0 + kLanes <= w; c0 += kLanes) {
    column_amax(buf + c0, ld, h, kLanes, part.data());
    for (size_t j = 0; j < lanes.size(); ++j) lanes[j] = nan_max(lanes[j], part[j]);
  }
  float m = 0.0f;
  for (const float v : lanes) m = nan_max(m, v);
  for (int64_t r = 0; r < h; ++r)
    for (int64_t c = w - w % kLanes; c < w; ++c) m = nan_max(m, std::fabs(buf[r * ld + c]));
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
  if (l.transposed && l.tile_cols == 1 && !per_tensor) {
    // x^T's 1 x n tiles are n x 1 columns of the source: every column's amax over a tile's rows in
    // one sweep along the rows, instead of a strided walk per column.
    std::array<float, kBlockCols> amax;
    for (int64_t tr = r0; tr < r1; tr += l.tile_rows) {
      const int64_t er = std::min(r1, tr + l.tile_rows);
      const float* rows_at = buf + (tr - r0) * ld;
      column_amax(rows_at, ld, er - tr, c1 - c0, amax.data());
      for (int64_t c = c0; c < c1; ++c) {
        const float scale =
            tile_scale(l, c * l.scale_cols + tr / l.tile_rows, amax[static_cast<size_t>(c - c0)], o, fp8_max);
        encode_run<F>(codes + c * rows + tr, 1, rows_at + (c - c0), ld, er - tr, scale);
      }
    }
    return;
  }
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

// Runs body(r0, r1, c0, c1, buf, ld) on every block of source rows [row0, row1) (row0 a multiple of
// kBlockRows) with the block filled, blocks spread over threads, one buffer per thread; returns the
// largest |value| seen (NaN if any was).
template <typename Body>
float for_each_block(const Fp8Source& src, int64_t row0, int64_t row1, Body body) {
  const int64_t block_rows = ceil_div(row1 - row0, kBlockRows), block_cols = ceil_div(src.cols, kBlockCols);
  const int64_t blocks = block_rows * block_cols;
  std::vector<float> block_amax(static_cast<size_t>(blocks), 0.0f);
#pragma omp parallel
  {
    std::vector<float> buf(static_cast<size_t>(kBlockRows * kBlockCols));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r0 = row0 + b / block_cols * kBlockRows, c0 = b % block_cols * kBlockCols;
      const int64_t r1 = std::min(row1, r0 + kBlockRows), c1 = std::min(src.cols, c0 + kBlockCols);
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

}  // namespace

struct Fp8StripeQuantizer::State {
  Fp8Source src;
  Fp8QuantizeOptions options;
  float fp8_max;
  Fp8Layouts out;
  std::vector<Layout> layouts;  // point into `out`, so State stays where it was made
  float tensor_scale = 1.0f;
  float amax = 0.0f;  // of the rows read so far
  int64_t done = 0;   // rows read so far

  // Per-tensor current scaling: the scale waits for the whole amax, the codes for finish().
  bool deferred() const { return options.granularity == Fp8Granularity::Tensor && !options.scale; }

  // Rows [r0, r1) encoded into every layout at the scales known now.
  void encode(int64_t r0, int64_t r1) {
    const Fp8QuantizeOptions& o = options;
    const auto encode_layouts = [&](int64_t b0, int64_t b1, int64_t c0, int64_t c1, const float* buf, int64_t ld) {
      for (const Layout& l : layouts)
        (o.format == fp8::Format::E4M3 ? encode_block<fp8::Format::E4M3>
                                       : encode_block<fp8::Format::E5M2>)(l, buf, ld, b0, b1, c0, c1, src.rows,
                                                                          src.cols, o, fp8_max, tensor_scale);
    };
    amax = nan_max(amax, for_each_block(src, r0, r1, encode_layouts));
  }
};

Fp8StripeQuantizer::Fp8StripeQuantizer(Fp8Source src, const Fp8QuantizeOptions& o, bool rowwise, bool columnwise,
                                       const std::string& row_name, const std::string& column_name)
    : s_(std::make_unique<State>()) {
  check_fp8_quantize_options(src.name, o);
  MEGATON_CHECK(rowwise || columnwise, "FP8 quantisation of '", src.name, "' asks for no layout");
  s_->src = std::move(src);
  s_->options = o;
  s_->fp8_max = fp8::info(o.format).max;
  const int64_t rows = s_->src.rows, cols = s_->src.cols;
  if (rowwise) s_->layouts.push_back(make_layout(s_->out.rowwise, o, false, rows, cols, row_name));
  if (columnwise) s_->layouts.push_back(make_layout(s_->out.columnwise, o, true, rows, cols, column_name));
  if (o.granularity == Fp8Granularity::Tensor && o.scale)
    for (const Layout& l : s_->layouts)  // an empty matrix has an empty scale grid
      if (l.out->scale_inv.numel() > 0) s_->tensor_scale = tile_scale(l, 0, 0.0f, o, s_->fp8_max);
}

Fp8StripeQuantizer::~Fp8StripeQuantizer() = default;
Fp8StripeQuantizer::Fp8StripeQuantizer(Fp8StripeQuantizer&&) noexcept = default;

void Fp8StripeQuantizer::rows(int64_t r0, int64_t r1) {
  State& s = *s_;
  MEGATON_CHECK(r0 == s.done && r0 < r1 && r1 <= s.src.rows && (r1 % kFp8StripeRows == 0 || r1 == s.src.rows),
                "FP8 quantisation of '", s.src.name, "': rows [", r0, ", ", r1, ") out of order (", s.done, " of ",
                s.src.rows, " done; stripes of ", kFp8StripeRows, ")");
  s.done = r1;
  if (s.deferred())
    s.amax = nan_max(s.amax, for_each_block(s.src, r0, r1, [](auto...) {}));
  else
    s.encode(r0, r1);
}

Fp8Layouts Fp8StripeQuantizer::finish() {
  State& s = *s_;
  MEGATON_CHECK(s.done == s.src.rows, "FP8 quantisation of '", s.src.name, "' finished after ", s.done, " of ",
                s.src.rows, " rows");
  if (s.deferred()) {
    for (const Layout& l : s.layouts)
      s.tensor_scale = l.out->scale_inv.numel() > 0 ? tile_scale(l, 0, s.amax, s.options, s.fp8_max) : 1.0f;
    s.amax = 0.0f;  // the codes' pass reads every value again and records their amax
    if (s.src.rows > 0) s.encode(0, s.src.rows);
  }
  for (const Layout& l : s.layouts) l.out->amax = s.amax;
  return std::move(s.out);
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

namespace {
// The whole source in one stripe.
Fp8Layouts quantize_all(const Fp8Source& x, const Fp8QuantizeOptions& options, bool rowwise, bool columnwise,
                        const std::string& row_name, const std::string& column_name) {
  Fp8StripeQuantizer q(x, options, rowwise, columnwise, row_name, column_name);
  if (x.rows > 0) q.rows(0, x.rows);
  return q.finish();
}
}  // namespace

Fp8Matrix fp8_quantize(const Fp8Source& x, const Fp8QuantizeOptions& options, const std::string& name) {
  Fp8Layouts q = quantize_all(x, options, !options.transpose, options.transpose, name, name);
  return std::move(options.transpose ? q.columnwise : q.rowwise);
}

Fp8Layouts fp8_quantize_both(const Fp8Source& x, const Fp8QuantizeOptions& options, const std::string& row_name,
                             const std::string& column_name) {
  MEGATON_CHECK(!options.transpose, "fp8_quantize_both of '", x.name, "' writes both layouts; transpose is not an option");
  return quantize_all(x, options, true, true, row_name, column_name);
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
