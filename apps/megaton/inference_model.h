// What `generate` and `serve` start from: an HF model folder in the run precision and a tokenizer whose
// ids the model can embed (checked both ways at load, not at the first request).
#pragma once
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "megaton/data/tokenizer.h"
#include "megaton/models/transformer_model.h"

namespace megaton::app {

struct InferenceModel {
  std::unique_ptr<models::TransformerModel> model;
  std::unique_ptr<data::Tokenizer> tokenizer;
  double load_s = 0;  // reading, converting and checking both
};

// precision: "fp32" or "bf16" (bf16 compute copies of the weights, bf16 activations). weights_dtype:
// "auto" (the weights in the precision) or "int8" / "fp8-block" (kernels/quantized_linear.h: every
// layer's linears and the output head read 8-bit codes with block scales, dequantised inside the
// GEMV / GEMM; the embedding and norms stay in the precision).
InferenceModel load_inference_model(const std::string& model_dir, const std::string& tokenizer_spec,
                                    const std::string& precision, const std::string& weights_dtype);

// The --precision and --weights-dtype options generate and serve share.
void add_inference_dtype_options(CLI::App* cmd, std::string& precision, std::string& weights_dtype);

}  // namespace megaton::app
