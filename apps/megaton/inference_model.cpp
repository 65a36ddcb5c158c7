#include "inference_model.h"

#include <chrono>

#include "megaton/core/allocator.h"
#include "megaton/core/error.h"
#include "megaton/models/hf_format.h"

namespace megaton::app {

InferenceModel load_inference_model(const std::string& model_dir, const std::string& tokenizer_spec,
                                    const std::string& precision, const std::string& weights_dtype) {
  const auto start = std::chrono::steady_clock::now();
  InferenceModel m;
  // Unless they are to be re-quantised, which reads their f32 values, the weights are held as the run
  // reads them alone: in bf16 (half of fp32's memory, a bf16 file's mapped as it is), or as a quantised
  // folder's codes.
  const bool requantise = weights_dtype != "auto";
  const models::ServeWeights held{precision == "bf16" && !requantise ? DType::BF16 : DType::F32, !requantise};
  models::HfFolder folder = models::load_hf_folder(model_dir, /*gradients=*/false, held);
  m.model = std::move(folder.model);
  // A quantised folder's own codes serve as stored (auto); another --weights-dtype re-quantises the
  // values they stand for.
  if (weights_dtype != "auto")
    m.model->quantize_weights(kernels::weight_quant_from_name(weights_dtype));
  else if (folder.quantization)
    m.model->install_quantized_weights(*folder.quantization, folder.quantized);
  m.model->set_compute_dtype(precision == "bf16" ? DType::BF16 : DType::F32);
  Allocator::host().empty_cache();  // the values quantisation or bf16 replaced
  m.tokenizer = data::make_tokenizer(tokenizer_spec);
  m.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (m.tokenizer->vocab_size() > m.model->config().vocab_size)
    fail("--tokenizer ", tokenizer_spec, " has ", m.tokenizer->vocab_size(), " ids but the model's vocab_size is ",
         m.model->config().vocab_size);
  return m;
}

void add_inference_dtype_options(CLI::App* cmd, std::string& precision, std::string& weights_dtype) {
  cmd->add_option("--precision", precision,
                  "Activations and weights in fp32, or bf16 (bf16 copies of the weights and a bf16 KV cache: half the "
                  "bytes per token)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_option("--weights-dtype", weights_dtype,
                  "The layers' and the head's weights as --precision says, or as a quantised folder stores them "
                  "(auto), or as 8-bit codes dequantised "
                  "inside the kernels: int8 (one scale per row) or fp8-block (E4M3, one scale per 128 x 128 "
                  "block, as DeepSeek-V3 ships): a quarter of fp32's bytes per token")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "int8", "fp8-block"}));
}

}  // namespace megaton::app
