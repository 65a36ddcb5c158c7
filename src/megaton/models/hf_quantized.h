// Quantised weights in HF model folders (issue 15): `megaton convert --weights-dtype fp8-block|int8`
// stores each transformer layer's linear weights (and an untied lm_head) as 8-bit codes, with fp32
// scales beside each one under "<name>_scale_inv". The value at (r, c) of a stored [rows, cols]
// tensor is code(r, c) * scale_inv[r / block_rows][c / block_cols]: DeepSeek-V3's released layout,
// named in config.json's quantization_config:
//   fp8-block  E4M3 codes, 128 x 128 blocks: {"quant_method": "fp8", "fmt": "e4m3",
//              "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, DeepSeek-V3's own
//              (transformers' fine-grained FP8 loader reads Llama folders in it);
//   int8       int8 codes, one symmetric scale per output row: {"quant_method": "megaton_int8_row"},
//              Megaton's own. scale_inv is [out, 1], or [1, out] for a weight stored [in, out]
//              (GPT-2's Conv1D), whose output rows are the stored columns.
// The codes are those kernels::quantize_weight makes (the same rounding and scales), computed on
// each HF tensor as stored: q_proj, k_proj and v_proj each have their own blocks.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "megaton/kernels/quantized_linear.h"

namespace megaton::models {

// config.json's quantization_config for q, and the format a config names: nullopt without one;
// an unknown method, format or block size is an error naming `source`.
nlohmann::json quantization_config(kernels::WeightQuant q);
std::optional<kernels::WeightQuant> stored_quantization(const nlohmann::json& config, const std::string& source);

// "X.weight" -> "X.weight_scale_inv".
std::string scale_inv_name(const std::string& weight_name);

// One stored weight: codes and scales in the stored tensor's own layout. `transposed`: the tensor
// is stored [in, out], so int8's per-output-row scales run along its columns.
struct StoredQuantized {
  Tensor codes;      // I8 or F8E4M3 [rows, cols]
  Tensor scale_inv;  // F32 [ceil(rows / block_rows), ceil(cols / block_cols)]
  int64_t block_rows = 1, block_cols = 1;
  float scale(int64_t r, int64_t c) const {
    return scale_inv.data<float>()[(r / block_rows) * scale_inv.size(1) + c / block_cols];
  }
};

// w: a 2-D f32 tensor as stored (finite values).
StoredQuantized quantize_stored(const Tensor& w, kernels::WeightQuant q, bool transposed);
// A stored pair checked against q's layout: the codes' dtype, the scale grid's dtype and shape,
// finite non-negative scales, no NaN code. Errors name the tensor and `source`.
StoredQuantized check_stored(const Tensor& codes, const Tensor& scale_inv, kernels::WeightQuant q, bool transposed,
                             const std::string& name, const std::string& source);
// The f32 values the codes stand for, in the stored layout.
Tensor dequantize_stored(const StoredQuantized& s);
// The f32 value of code c (an I8 or E4M3 byte).
float decode_code(uint8_t code, DType dtype);

}  // namespace megaton::models
