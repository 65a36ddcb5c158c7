// Hugging Face model folders: config.json + model.safetensors with HF tensor names and layouts.
// GPT-2 (GPT2LMHeadModel: Conv1D weights stored [in, out], "transformer."-prefixed or bare
// names), Llama (LlamaForCausalLM: separate q/k/v and gate/up projections, rotate_half RoPE) and
// Mixtral (MixtralForCausalLM: a Llama whose MLPs are block_sparse_moe experts). Other MoE models
// are written under DeepSeek-V3's tensor names with Megaton's own model_type.
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megaton/models/transformer_model.h"

namespace megaton::models {

// `source` names the file in error messages.
TransformerConfig config_from_hf(const nlohmann::json& j, const std::string& source);
nlohmann::json config_to_hf(const TransformerConfig& c);
// A config MixtralForCausalLM expresses exactly: MoE in every layer, softmax top-k over the selected
// logits, no shared expert, groups, expert bias, scaling, z-loss or capacity.
bool is_mixtral_shaped(const TransformerConfig& c);

// Parameter values (or their gradients) under HF names, in HF layouts.
std::vector<std::pair<std::string, Tensor>> to_hf_tensors(TransformerModel& model, bool gradients = false);
// Copies HF tensors into the model; a missing tensor, a wrong shape or an unknown name is an
// error naming it and `source`. Tensors stored quantised (models/hf_quantized.h; `quantization` is
// the folder's format) load as the values their codes stand for; the codes and scales come back
// too, in Megaton's layout (a fused weight's rows each keep their stored block's scales), keyed by
// parameter.
TransformerModel::StoredQuantizedWeights load_hf_tensors(TransformerModel& model,
                                                         const std::map<std::string, Tensor>& tensors,
                                                         const std::string& source,
                                                         std::optional<kernels::WeightQuant> quantization = {});

// DIR/config.json + DIR/model.safetensors (each written atomically), the tensors in `dtype` (f32, or
// bf16: half the bytes, rounded to nearest even; loading widens them back to f32 exactly). With
// `quantization`, the weights TransformerModel::quantize_weights replaces (an untied head's
// included) are stored as 8-bit codes and scales instead (models/hf_quantized.h).
void save_hf_model(TransformerModel& model, const std::string& dir, DType dtype = DType::F32,
                   std::optional<kernels::WeightQuant> quantization = {});
// DIR/config.json alone (what save_hf_model writes beside the weights; a training checkpoint's too).
void save_hf_config(const TransformerConfig& c, const std::string& dir, DType dtype = DType::F32,
                    std::optional<kernels::WeightQuant> quantization = {});
// A folder's model (quantised weights loaded as their values), its quantisation format and the
// stored codes, which TransformerModel::install_quantized_weights takes for inference.
struct HfFolder {
  std::unique_ptr<TransformerModel> model;
  std::optional<kernels::WeightQuant> quantization;
  TransformerModel::StoredQuantizedWeights quantized;
};
// How a model built without gradients, to serve, holds its weights: without an f32 main weight where
// nothing it runs reads one.
struct ServeWeights {
  // bf16: the weights its GEMMs read (TransformerModel::gemm_weights) are held in bf16 alone: bf16
  // views of a bf16 file, else rounded to nearest even as they load; set_compute_dtype(bf16) lends them
  // as their own compute copies, and the model can compute in bf16 only.
  DType dtype = DType::F32;
  // A quantised folder's weights are held as their 8-bit codes alone: value is the codes (I8 or
  // F8E4M3, the storage of HfFolder::quantized's codes, which install_quantized_weights then takes),
  // with no dequantised copy. Not for a model that re-quantises its weights (quantize_weights reads
  // their values).
  bool codes = false;
};
// The file is memory-mapped (core/mapped_file.h). gradients false: the model is built without them
// (nn::NoGradients), for inference only, and every weight stored in the dtype it is held in and in the
// layout the model runs, on a 64-byte boundary, is a view of the mapped file rather than a copy (a write
// to it copies the page, never the file); `serve` says what else it leaves out.
HfFolder load_hf_folder(const std::string& dir, bool gradients = true, ServeWeights serve = {});
std::unique_ptr<TransformerModel> load_hf_model(const std::string& dir);
TransformerConfig load_hf_config(const std::string& dir);

}  // namespace megaton::models
