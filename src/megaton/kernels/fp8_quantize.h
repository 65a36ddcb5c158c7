// FP8 quantisation of a row-major matrix [rows, cols] with the scaling granularities of the recipes:
//   Tensor       one scale for the whole tensor (delayed or current scaling);
//   Tile1x128    one scale per 1 x 128 run of a row (DeepSeek-V3's activations and gradients);
//   Block128x128 one scale per 128 x 128 block (DeepSeek-V3's weights);
//   Mx1x32       one power-of-two E8M0 scale per 1 x 32 run of a row (OCP MXFP8).
// Ragged edges form smaller tiles. The data is F8E4M3 / F8E5M2 (one byte per element, as the
// allocator counts it); scale_inv is fp32 [scale rows, scale cols], or U8 E8M0 codes for Mx1x32.
// A quantised value is q = encode(x * scale), and x ~ decode(q) * scale_inv with scale_inv = 1 / scale,
// as TransformerEngine stores them. fp8_dequantize(fp8_quantize(x)) is x rounded to FP8 at the
// tile's scale. A CUDA tensor is quantised on its device (kernels/cuda/fp8_quantize.h): the same
// codes, scales and amax bit for bit (both run fp8_scale_from_amax and fp8::encode_inline); MXFP8
// and the Fp8Source forms are CPU only.
//
// The quantiser reads its input through an Fp8Source, a block at a time (128 rows x 512 columns,
// so no tile of any granularity, in either layout, straddles two blocks): a tensor widened as read,
// or a fused producer whose output is never written in a wider dtype (kernels/fp8_sources.h: a
// norm's output for LayerNormLinear, an activation's for LayerNormMLP). Both layouts a linear
// needs, x and x^T, come from one pass over the source.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "megaton/core/fp8_format.h"
#include "megaton/core/tensor.h"
#include "megaton/kernels/fp8_scale.h"

namespace megaton::kernels {

// The MX scale of a block with this amax: the E8M0 of amax / fp8_max, rounded up, so every
// |x| / 2^(code - 127) <= fp8_max.
uint8_t mx_scale_code(float amax, float fp8_max);

enum class Fp8Granularity : uint8_t { Tensor, Tile1x128, Block128x128, Mx1x32 };
std::string_view granularity_name(Fp8Granularity g);
struct Fp8TileShape {
  int64_t rows, cols;
};
// The elements one scale covers in a [rows, cols] matrix (the whole matrix for Tensor).
Fp8TileShape fp8_tile_shape(Fp8Granularity g, int64_t rows, int64_t cols);

struct Fp8Matrix {
  Tensor data;       // F8E4M3 / F8E5M2 codes, [rows, cols]
  Tensor scale_inv;  // F32 (or U8 E8M0 for Mx1x32), [scale rows, scale cols]
  Fp8Granularity granularity = Fp8Granularity::Tensor;
  float amax = 0.0f; // of the whole input (NaN if it held one): what delayed scaling records
  fp8::Format format() const { return fp8::format_of_dtype(data.dtype()); }
  Fp8TileShape tile() const { return fp8_tile_shape(granularity, data.size(0), data.size(1)); }
  // The factor that turns the code at (row, col) back into its value: scale_inv of its tile.
  float scale_inv_at(int64_t row, int64_t col) const;
  // The codes and scales copied to `device` (granularity and amax kept).
  Fp8Matrix to(Device device, MemCategory category = MemCategory::Workspace) const;
};

struct Fp8QuantizeOptions {
  fp8::Format format = fp8::Format::E4M3;
  Fp8Granularity granularity = Fp8Granularity::Tensor;
  // Tensor granularity only: quantise with this given scale (delayed scaling) instead of one
  // computed from the tensor's own amax (current scaling).
  std::optional<float> scale = std::nullopt;
  bool pow2_scales = false;  // current / block scales rounded down to powers of two
  // Quantise x^T ([cols, rows]) instead of x: the K-contiguous operand of a backward GEMM (the
  // weight gradient contracts over the rows), tiled along its own rows as DeepSeek-V3 re-tiles.
  bool transpose = false;
  MemCategory category = MemCategory::Activations;
};

// Throws naming `name` when the options contradict each other (a given scale with tiles) or the
// given scale is not finite and positive. Both backends check with it.
void check_fp8_quantize_options(const std::string& name, const Fp8QuantizeOptions& options);

// A [rows, cols] matrix produced on demand: fill(r0, r1, c0, c1, out, ld) writes the f32 values of
// rows [r0, r1) x columns [c0, c1) to out, row stride ld. The quantiser may ask for a block twice
// (per-tensor current scaling reads the amax first) and from several threads at once, so fill must
// be a pure function of its arguments.
struct Fp8Source {
  int64_t rows = 0, cols = 0;
  std::string name;  // for error messages
  std::function<void(int64_t r0, int64_t r1, int64_t c0, int64_t c1, float* out, int64_t ld)> fill;
};
// x: 2-D, f32 or bf16, on the host; widened exactly as read.
Fp8Source fp8_source(const Tensor& x);

// x: 2-D, f32 or bf16, on the host or a CUDA device (the result lives where x does).
Fp8Matrix fp8_quantize(const Tensor& x, const Fp8QuantizeOptions& options, const std::string& name = "fp8");
Fp8Matrix fp8_quantize(const Fp8Source& x, const Fp8QuantizeOptions& options, const std::string& name = "fp8");
// Both layouts of x from one pass over the source: rowwise = fp8_quantize(x, options) and
// columnwise = the same with `transpose` (options.transpose must be false). Under a per-tensor
// scale the columnwise codes are the rowwise ones transposed, as fp8_transpose would give them.
struct Fp8Layouts {
  Fp8Matrix rowwise, columnwise;
};
Fp8Layouts fp8_quantize_both(const Fp8Source& x, const Fp8QuantizeOptions& options, const std::string& row_name,
                             const std::string& column_name);

// The rows a source is quantised in when its producer hands them over as it finishes them.
constexpr int64_t kFp8StripeRows = 128;
// Quantisation of a source stripe by stripe, in order, as its producer finishes rows: an FP8 GEMM's
// epilogue (kernels/fp8_gemm.h's rows_done: LayerNormMLP's activation and cast of fc2's input,
// while fc1's output rows are still in cache). The layouts asked for are allocated at construction.
// When every scale is known as a stripe is done (a given per-tensor scale, or tiles and blocks,
// each its own), rows() encodes the stripe; a per-tensor scale from the whole tensor's amax (current
// scaling) is known only at the end, so rows() reads the stripe's amax and finish() encodes the
// whole source in a second pass, as fp8_quantize does. The result is fp8_quantize's to the bit.
class Fp8StripeQuantizer {
 public:
  Fp8StripeQuantizer(Fp8Source src, const Fp8QuantizeOptions& options, bool rowwise, bool columnwise,
                     const std::string& row_name, const std::string& column_name);
  ~Fp8StripeQuantizer();
  Fp8StripeQuantizer(Fp8StripeQuantizer&&) noexcept;
  // Rows [r0, r1): r0 the rows done so far, r1 a multiple of kFp8StripeRows or the last row.
  void rows(int64_t r0, int64_t r1);
  // After the last row: the layouts asked for (the other left empty).
  Fp8Layouts finish();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// The same values transposed, without re-quantising: exact for per-tensor scales and 128x128
// blocks (the block grid transposes with them); tiles along a row cannot be transposed (quantise
// the source with `transpose` instead) and are refused.
Fp8Matrix fp8_transpose(const Fp8Matrix& q, const std::string& name);
// The f32 matrix the codes stand for.
Tensor fp8_dequantize(const Fp8Matrix& q, MemCategory category = MemCategory::Workspace);

}  // namespace megaton::kernels
