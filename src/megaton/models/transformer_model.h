// Decoder-only transformer (GPT-2, Llama, ...) assembled from nn/ modules by TransformerConfig.
// The layers are split into model chunks (models/model_chunk.h: one by default; a pipeline stage
// runs its chunks' F, B and W), and forward() / backward() here run every chunk in order.
// forward() and backward() are separate so a schedule can interleave micro-batches; every
// micro-batch keeps its activations in its own ModelCtx.
//
// Under pipeline parallelism (a StageLayout whose chunks live on several ranks) the model holds
// only its rank's chunks: their layers, the embedding with chunk 0, the final norm and head with
// the last. Its parameters, and so the gradient buffer and optimizer built over them, are this
// stage's alone. With tied embeddings a last stage without chunk 0 holds a copy of the word
// embedding as the head's weight, under the embedding's name; the training step sums the two
// copies' gradients (Megatron's embedding group) so they stay identical.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "megaton/kernels/quantized_linear.h"
#include "megaton/models/model_chunk.h"
#include "megaton/models/stage_layout.h"
#include "megaton/models/transformer_config.h"
#include "megaton/nn/moe/moe_layer.h"
#include "megaton/nn/mtp_layer.h"

namespace megaton::models {

struct ModelCtx {
  std::vector<ChunkCtx> chunks;  // one per model chunk (of the whole model: those of other stages stay empty)
};

// Multi-token prediction's losses over a training step's micro-batches: per depth, the sum of the
// micro-batch means and how many micro-batches added one.
struct MtpStepLosses {
  std::vector<double> sums;
  int64_t microbatches = 0;
};

struct LossResult {
  double loss = 0;     // mean cross-entropy over the tokens with a target
  int64_t tokens = 0;  // number of such tokens
};

class TransformerModel {
 public:
  // num_chunks: how many model chunks the layers are split into, evenly (it must divide
  // num_layers); the result does not depend on it. tp: the tensor-parallel group this process's
  // shard of the model belongs to (none by default: the whole model); heads, ffn_hidden_size and
  // the padded vocabulary are split over it, errors naming the sizes that do not divide.
  explicit TransformerModel(const TransformerConfig& config, int64_t num_chunks = 1, const nn::TensorParallel& tp = {});
  // This rank's stage of the model under `layout` (validated against the config: errors name the
  // sizes); init and results do not depend on the layout. ep: the expert-parallel group the MoE
  // layers' routed experts are split over (none by default).
  TransformerModel(const TransformerConfig& config, StageLayout layout, const nn::TensorParallel& tp = {},
                   const nn::ExpertParallel& ep = {});
  TransformerModel(const TransformerModel&) = delete;
  TransformerModel& operator=(const TransformerModel&) = delete;

  const TransformerConfig& config() const { return config_; }
  const nn::TensorParallel& tensor_parallel() const { return tp_; }
  const nn::ExpertParallel& expert_parallel() const { return ep_; }
  // The groups parameters are split over, for gathering and counting them (nn/tensor_shards.h).
  nn::ShardGroups shard_groups() const { return {tp_, ep_}; }
  // Whether some parameter is split over a group of more than one rank, or the layers are cut into
  // pipeline stages: the whole model must then be gathered for an export.
  bool split() const { return tp_.active() || ep_.active() || layout_.split(); }
  const StageLayout& stage_layout() const { return layout_; }
  // This rank's parameters (the whole model's without pipeline parallelism).
  const nn::ParameterList& parameters() const { return params_; }
  // Where parameters()[i] sits in layer order (StageLayout: -1 embedding, a layer, L final norm
  // and head); the last stage's copy of a tied embedding sits at -1 with the embedding.
  int64_t position(size_t i) const { return positions_.at(i); }
  // The tied word embedding whose gradient this stage sums with another's (Megatron's
  // shared_embedding_or_output_weight): the embedding on the stage holding chunk 0, the head's copy
  // on the one holding the last, when those are different ranks; else null.
  nn::Parameter* embedding_group_weight();
  // Normal(0, init_method_std) for matrices and embeddings, the output projections of each block
  // scaled by 1/sqrt(2 num_layers) (GPT-2 / Megatron), norms 1, biases 0. Each tensor draws from
  // its own Philox stream keyed by its name over its global (unpadded) shape, so init is independent
  // of order, threads and the tensor-parallel layout: a shard is the slice of the whole tensor.
  void init_weights(uint64_t seed);

  // Mixed precision (Megatron's --bf16): bf16 activations and GEMMs with fp32 main weights, grads
  // and optimizer state. Gives every weight a linear or the head reads (gemm_weights) a compute copy
  // in `dtype`; f32 drops them. A weight whose value is already in `dtype` (a model loaded to serve in
  // bf16 only: models/hf_format.h) is its own compute copy; it cannot compute in another dtype.
  void set_compute_dtype(DType dtype);
  // The weights a linear, an expert or the head reads as a GEMM operand: those set_compute_dtype gives
  // compute copies.
  nn::ParameterList gemm_weights();
  // Activation recompute (nn/recompute.h) for training from now on: full recompute's units in each
  // model chunk, selective recompute's modules in each block.
  void set_recompute(const nn::RecomputeConfig& config);
  // The fused kernels every layer runs (nn/fusion.h; on by default).
  void set_fusion(const nn::FusionConfig& config);
  // Inference with 8-bit weights (kernels/quantized_linear.h): from now on every transformer layer's
  // linears and the output head read int8 / FP8 codes with block scales, and their compute copies
  // are dropped (a tied head's is the embedding's, which stays), and so are their main weights: each
  // such weight's value becomes its codes (nn::f32_values dequantises them). The embedding lookup,
  // norms, the MoE router and routed experts keep the compute dtype. Forward only; refused under
  // tensor or pipeline parallelism.
  void quantize_weights(kernels::WeightQuant q) { install_quantized_weights(q, {}); }
  // The same with the weights a quantised HF folder stored (models/hf_quantized.h), keyed by
  // parameter; a weight not among them (a tied head) is quantised to q from its main weight.
  using StoredQuantizedWeights = std::map<const nn::Parameter*, std::shared_ptr<const kernels::QuantizedWeight>>;
  void install_quantized_weights(kernels::WeightQuant q, const StoredQuantizedWeights& stored);
  // The weights quantize_weights replaces: every transformer layer's linears' and the head's
  // (a tied head's is the embedding).
  std::vector<nn::Parameter*> quantizable_weights();
  DType compute_dtype() const { return compute_dtype_; }
  // Re-rounds the compute copies from the main weights. Call after the weights change (init, a
  // load, an optimizer step) and before the next forward; nothing to do in f32.
  void refresh_compute_weights() { nn::refresh_compute_copies(params_); }
  // FP8 GEMMs (fp8/recipe.h) in the linears of transformer layers [first_layer, end_layer) (global
  // layer numbers; default all); the embedding and the output head stay in the compute dtype.
  void enable_fp8(const fp8::Fp8Config& config, int64_t first_layer = 0, int64_t end_layer = INT64_MAX);
  // What enable_fp8 was given (nullopt without FP8): a whole-model copy repeats it to hold every
  // stage's FP8 state.
  struct Fp8Setting {
    fp8::Fp8Config config;
    int64_t first_layer, end_layer;
  };
  const std::optional<Fp8Setting>& fp8_setting() const { return fp8_setting_; }
  // The layers' FP8 quantizers (empty without FP8): a training step rolls their delayed-scaling
  // histories once per step, after reducing the newest amaxes over the parallel groups.
  std::vector<fp8::LinearQuantizer*> fp8_quantizers();
  std::vector<const fp8::LinearQuantizer*> fp8_quantizers() const;

  // tokens, targets: [B, T] i32 (targets may hold kernels::kIgnoreIndex). With
  // compute_grad, the loss head also produces the gradient of loss_scale * mean loss at the
  // final hidden state and the head's weight gradient (kept for backward_weight with
  // defer_head_weight_grad); backward() then finishes the pass.
  LossResult forward(ModelCtx& ctx, const Tensor& tokens, const Tensor& targets, bool compute_grad,
                     float loss_scale = 1.0f, bool defer_head_weight_grad = false);
  // The loss op on the last chunk's output (what forward() ends with; a stage running chunk by
  // chunk calls it after the last chunk's forward). Scales the gradient to loss_scale * mean.
  LossResult loss(ModelCtx& ctx, const Tensor& output, const Tensor& targets, bool compute_grad, float loss_scale,
                  bool defer_head_weight_grad);
  // Accumulates every parameter gradient, each block's W right after its B.
  void backward(ModelCtx& ctx);
  // B: input gradients through every layer down to the embedding output; keeps what W needs.
  void backward_input(ModelCtx& ctx);
  // W: every weight gradient (the head's if deferred, the layers in reverse order, then the
  // embedding); frees the context. Without deferral the fused loss head adds the head's during
  // forward.
  void backward_weight(ModelCtx& ctx);

  // Incremental decoding (an unsharded model): one KV cache per layer; returns the logits of each
  // sequence's last new token, [B, vocab].
  std::vector<nn::KVCache> new_kv_caches(int64_t B, int64_t max_len) const;
  // The dtype of the caches new_kv_caches / new_mtp_cache make from now on: f32, or bf16 (half the
  // bytes each decode step reads; keys and values rounded to bf16 as they are cached, the attention's
  // math in the compute dtype, as serve's bf16 pages). Until set: bf16 for a bf16 model, else f32.
  // MLA keeps its latent cache in f32 either way.
  void set_kv_cache_dtype(DType dtype);
  DType kv_cache_dtype() const;
  Tensor forward_cached(std::vector<nn::KVCache>& caches, const Tensor& tokens);
  // Continuous batching's step (infer/continuous_batching.h): a paged cache of num_pages pages of
  // page_size tokens for every layer, and the last-position logits [S, V] of tokens [S, T], row s
  // continuing seqs[s] (whose pages must already hold its len + T tokens; len advances by T).
  nn::PagedKVCache new_paged_kv_cache(int64_t num_pages, int64_t page_size, DType dtype = DType::F32) const;
  bool supports_paged_kv() const;  // unsharded, and every layer's attention has a paged form
  Tensor forward_paged(nn::PagedKVCache& cache, const std::vector<nn::PagedSequence*>& seqs, const Tensor& tokens);
  // The same pass returning the final-norm hidden state of every new position, [B*T, hidden]
  // (speculative decoding verifies several positions at once), and the logits of such rows.
  Tensor forward_cached_hidden(std::vector<nn::KVCache>& caches, const Tensor& tokens);
  Tensor logits(const Tensor& hidden);
  // Multi-token prediction's first depth as a draft model: `hidden` holds the main model's final-norm
  // states of T positions per sequence and `next` [B, T] the token after each; both are appended to
  // the depth's own cache (new_mtp_cache) and its output rows [B*T, hidden] returned, whose logits
  // predict the token after `next`.
  nn::KVCache new_mtp_cache(int64_t B, int64_t max_len) const;
  Tensor mtp_forward_cached(nn::KVCache& cache, const Tensor& next, const Tensor& hidden);

  // The MoE layers (mlp_type "moe"), in layer order; empty for a dense model.
  std::vector<nn::MoeLayer*> moe_layers();
  // Per training step (Megatron's MoE hooks): the balancing losses' gradient scale, the same as
  // the main loss's; and after the optimizer step the auxiliary-loss-free bias update, with the
  // expert loads summed over `groups` (MoeLayer::update_expert_bias).
  void set_moe_aux_loss_grad_scale(double scale);
  // begin_step on every MoE layer; then each one's step_stats, in layer order.
  void begin_moe_step();
  std::vector<nn::MoeStats> moe_step_stats();
  void update_moe_expert_bias(const std::vector<parallel::Communicator*>& groups);

  // The modules this stage holds (each accessor throws on a stage without it).
  nn::Embedding& embedding();
  // This stage's layers, in layer order (every layer of a whole model).
  std::vector<std::unique_ptr<nn::TransformerBlock>>& layers() { return layers_; }
  nn::Norm& final_norm();
  nn::OutputHead& head();
  nn::Parameter& output_weight() { return head().weight(); }
  // Model chunks of the whole model; this stage holds some of them (every one without pipelining).
  size_t num_chunks() const { return layout_.num_chunks(); }
  ModelChunk& chunk(size_t c);
  // Every held chunk's (ModelChunk::set_param_gate).
  void set_param_gate(const ModelChunk::ParamGate& gate) {
    for (ModelChunk& c : chunks_) c.set_param_gate(gate);
    gate_ = gate;
  }
  // The multi-token prediction depths (mtp_num_layers; empty without).
  std::vector<std::unique_ptr<nn::MtpLayer>>& mtp_layers() { return mtp_; }
  // Per training step: MTP's mean loss per depth over the micro-batches that trained since
  // begin_mtp_step (empty without MTP).
  void begin_mtp_step() { mtp_step_ = {std::vector<double>(mtp_.size()), 0}; }
  std::vector<double> mtp_step_losses() const;

 private:
  // Every transformer layer's Linear modules, in layer order.
  std::vector<nn::Linear*> layer_linears();
  void check_whole(const char* what) const;  // throws when some chunk lives on another stage
  // False for a weight read only as 8-bit codes (install_quantized_weights): no compute copy.
  bool keeps_compute_copy(const nn::Parameter& p);
  // Incremental decoding through the embedding and every layer: the new positions' hidden states
  // before the final norm.
  Tensor decoder_cached(std::vector<nn::KVCache>& caches, const Tensor& tokens);
  // The logits [B, V] of the last of each sequence's T rows of decoder output h [B*T, C].
  Tensor last_position_logits(const Tensor& h, int64_t B, int64_t T);
  // The MTP depths' losses and gradients after the main loss of a training micro-batch: their
  // weight gradients (the shared head's and embedding's included) now, and the gradient at the
  // main model's final-norm output added to the last chunk's.
  void mtp_loss_and_grad(ModelCtx& ctx, const Tensor& output, const Tensor& targets, float loss_scale);

  TransformerConfig config_;
  nn::TensorParallel tp_;
  nn::ExpertParallel ep_;
  StageLayout layout_;
  nn::RopeTables rope_;
  std::unique_ptr<nn::Embedding> embedding_;  // with model chunk 0
  std::vector<std::unique_ptr<nn::TransformerBlock>> layers_;
  std::unique_ptr<nn::Norm> final_norm_;  // with the last model chunk, like the head
  std::unique_ptr<nn::OutputHead> head_;
  std::vector<std::unique_ptr<nn::MtpLayer>> mtp_;  // with the whole model (pipelining refuses MTP)
  MtpStepLosses mtp_step_;
  ModelChunk::ParamGate gate_;
  nn::ParameterList params_;
  std::vector<int64_t> positions_;
  std::vector<int64_t> layer_numbers_;  // the global layer number of each of layers_
  std::optional<Fp8Setting> fp8_setting_;    // per params_ entry
  std::vector<ModelChunk> chunks_;    // the held ones, in model-chunk order
  std::vector<int> chunk_index_;      // model chunk -> index into chunks_, -1 when not held
  DType compute_dtype_ = DType::F32;
  std::optional<DType> kv_cache_dtype_;
};

}  // namespace megaton::models
