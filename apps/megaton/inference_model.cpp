#include "inference_model.h"

#include <chrono>

#include "megaton/core/error.h"
#include "megaton/models/hf_format.h"

namespace megaton::app {

InferenceModel load_inference_model(const std::string& model_dir, const std::string& tokenizer_spec,
                                    const std::string& precision) {
  const auto start = std::chrono::steady_clock::now();
  InferenceModel m;
  m.model = models::load_hf_model(model_dir);
  m.model->set_compute_dtype(precision == "bf16" ? DType::BF16 : DType::F32);
  m.tokenizer = data::make_tokenizer(tokenizer_spec);
  m.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (m.tokenizer->vocab_size() > m.model->config().vocab_size)
    fail("--tokenizer ", tokenizer_spec, " has ", m.tokenizer->vocab_size(), " ids but the model's vocab_size is ",
         m.model->config().vocab_size);
  return m;
}

}  // namespace megaton::app
