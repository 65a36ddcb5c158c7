// What `generate` and `serve` start from: an HF model folder in the run precision and a tokenizer whose
// ids the model can embed (checked both ways at load, not at the first request).
#pragma once
#include <memory>
#include <string>

#include "megaton/data/tokenizer.h"
#include "megaton/models/transformer_model.h"

namespace megaton::app {

struct InferenceModel {
  std::unique_ptr<models::TransformerModel> model;
  std::unique_ptr<data::Tokenizer> tokenizer;
  double load_s = 0;  // reading, converting and checking both
};

// precision: "fp32" or "bf16" (bf16 compute copies of the weights).
InferenceModel load_inference_model(const std::string& model_dir, const std::string& tokenizer_spec,
                                    const std::string& precision);

}  // namespace megaton::app
