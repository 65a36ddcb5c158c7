#include "megaton/models/hf_quantized.h"

#include <cmath>

#include "megaton/core/error.h"
#include "megaton/core/fp8_format.h"
#include "megaton/kernels/cpu/gemv_quantized.h"

namespace megaton::models {

using kernels::WeightQuant;
using nlohmann::json;

namespace {

constexpr int64_t kFp8Block = 128;

struct Grid {
  int64_t block_rows, block_cols;
};

// The block shape of q over a stored [rows, cols] tensor.
Grid grid_of(WeightQuant q, int64_t rows, int64_t cols, bool transposed) {
  if (q == WeightQuant::Fp8Block) return {kFp8Block, kFp8Block};
  return transposed ? Grid{rows, 1} : Grid{1, cols};
}

DType codes_dtype(WeightQuant q) { return q == WeightQuant::Int8Row ? DType::I8 : DType::F8E4M3; }

int64_t blocks(int64_t n, int64_t block) { return block == 0 ? 0 : (n + block - 1) / block; }

// src [rows, cols] of `bytes`-sized elements -> [cols, rows].
Tensor transposed_copy(const Tensor& src, const std::string& name) {
  const int64_t rows = src.size(0), cols = src.size(1);
  Tensor t = Tensor::empty({cols, rows}, src.dtype(), MemCategory::Workspace, name);
  const auto bytes = static_cast<int64_t>(dtype_size(src.dtype()));
  const auto* s = static_cast<const unsigned char*>(src.raw());
  auto* d = static_cast<unsigned char*>(t.raw());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t b = 0; b < bytes; ++b) d[(c * rows + r) * bytes + b] = s[(r * cols + c) * bytes + b];
  return t;
}

}  // namespace

json quantization_config(WeightQuant q) {
  if (q == WeightQuant::Int8Row) return {{"quant_method", "megaton_int8_row"}};
  return {{"quant_method", "fp8"},
          {"fmt", "e4m3"},
          {"activation_scheme", "dynamic"},
          {"weight_block_size", {kFp8Block, kFp8Block}}};
}

std::optional<WeightQuant> stored_quantization(const json& config, const std::string& source) {
  const auto it = config.find("quantization_config");
  if (it == config.end() || it->is_null()) return std::nullopt;
  const json& q = *it;
  const std::string where = source + " quantization_config";
  if (!q.is_object()) fail(where, ": expected an object, got ", q.dump());
  const auto method = q.find("quant_method");
  if (method == q.end() || !method->is_string()) fail(where, ": missing string 'quant_method'");
  if (*method == "megaton_int8_row") return WeightQuant::Int8Row;
  if (*method != "fp8")
    fail(where, ": quant_method ", method->dump(), " is not supported (fp8 with 128 x 128 blocks, or megaton_int8_row)");
  if (const auto fmt = q.find("fmt"); fmt != q.end() && *fmt != "e4m3")
    fail(where, ": fmt ", fmt->dump(), " is not supported (e4m3)");
  const auto block = q.find("weight_block_size");
  if (block == q.end() || *block != json::array({kFp8Block, kFp8Block}))
    fail(where, ": weight_block_size ", block == q.end() ? std::string("(missing)") : block->dump(),
         " is not supported (per-tensor FP8 folders are not read; [128, 128] is)");
  return WeightQuant::Fp8Block;
}

std::string scale_inv_name(const std::string& weight_name) { return weight_name + "_scale_inv"; }

float decode_code(uint8_t code, DType dtype) {
  if (dtype == DType::I8) return static_cast<float>(static_cast<int8_t>(code));
  return fp8::decode(code, fp8::Format::E4M3);
}

StoredQuantized quantize_stored(const Tensor& w, WeightQuant q, bool transposed) {
  MEGATON_CHECK(w.dim() == 2 && w.dtype() == DType::F32, "quantize_stored: '", w.name(), "' must be a 2-D f32 tensor");
  const Grid g = grid_of(q, w.size(0), w.size(1), transposed);
  // int8's scales run along the output dimension: quantise [out, in] and store the transpose back.
  if (q == WeightQuant::Int8Row && transposed) {
    kernels::QuantizedWeight k = kernels::quantize_weight(transposed_copy(w, w.name()), q);
    Tensor scale = Tensor::empty({1, w.size(1)}, DType::F32, MemCategory::Workspace, w.name() + ".scale_inv");
    scale.copy_from(k.scale_inv.view({1, w.size(1)}));
    return {transposed_copy(k.codes, w.name()), std::move(scale), g.block_rows, g.block_cols};
  }
  kernels::QuantizedWeight k = kernels::quantize_weight(w, q);
  MEGATON_CHECK(k.block_rows == g.block_rows && k.block_cols == g.block_cols, "quantize_stored: block shape mismatch");
  return {std::move(k.codes), std::move(k.scale_inv), g.block_rows, g.block_cols};
}

StoredQuantized check_stored(const Tensor& codes, const Tensor& scale_inv, WeightQuant q, bool transposed,
                             const std::string& name, const std::string& source) {
  const std::string scale_name = scale_inv_name(name);
  const DType want = codes_dtype(q);
  if (codes.dim() != 2 || codes.dtype() != want)
    fail(source, ": tensor '", name, "' is ", dtype_name(codes.dtype()), " ", shape_str(codes.shape()), "; a ",
         kernels::weight_quant_name(q), " folder stores it as 2-D ", dtype_name(want));
  const int64_t rows = codes.size(0), cols = codes.size(1);
  const Grid g = grid_of(q, rows, cols, transposed);
  const Shape grid{blocks(rows, g.block_rows), blocks(cols, g.block_cols)};
  if (scale_inv.dtype() != DType::F32 || scale_inv.shape() != grid)
    fail(source, ": tensor '", scale_name, "' is ", dtype_name(scale_inv.dtype()), " ", shape_str(scale_inv.shape()),
         ", expected F32 ", shape_str(grid), " (one scale per ", g.block_rows, " x ", g.block_cols, " block of '", name,
         "')");
  const float* s = scale_inv.data<float>();
  for (int64_t i = 0; i < scale_inv.numel(); ++i)
    if (!std::isfinite(s[i]) || s[i] < 0)
      fail(source, ": tensor '", scale_name, "' holds ", s[i], " at element ", i, "; scales must be finite and >= 0");
  if (want == DType::F8E4M3) {
    const auto* c = static_cast<const uint8_t*>(codes.raw());
    for (int64_t i = 0; i < codes.numel(); ++i)
      if ((c[i] & 0x7f) == 0x7f) fail(source, ": tensor '", name, "' holds an E4M3 NaN code at element ", i);
  }
  return {codes, scale_inv, g.block_rows, g.block_cols};
}

Tensor dequantize_stored(const StoredQuantized& s) {
  const int64_t rows = s.codes.size(0), cols = s.codes.size(1);
  Tensor t = Tensor::empty({rows, cols}, DType::F32, MemCategory::Workspace, s.codes.name() + ".dequantized");
  // The stored grid is the layout the inference kernels read: their dequantisation serves.
  kernels::cpu::dequantize_rows(t.data<float>(),
                                {s.codes.raw(), s.codes.dtype(), s.scale_inv.data<float>(), s.block_rows, s.block_cols},
                                cols, 0, rows);
  return t;
}

}  // namespace megaton::models
