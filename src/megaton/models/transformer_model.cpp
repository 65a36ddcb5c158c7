#include "megaton/models/transformer_model.h"

#include <algorithm>
#include <cmath>

#include "megaton/core/rng.h"
#include "megaton/kernels/copy.h"
#include "megaton/kernels/quantized_linear.h"
#include "megaton/nn/tensor_shards.h"

namespace megaton::models {

namespace {
nn::BlockSpec block_spec(const TransformerConfig& c, const nn::TensorParallel& tp, const nn::ExpertParallel& ep) {
  nn::BlockSpec s;
  s.attention = c.attention_type;
  s.mlp = c.mlp_type;
  s.norm = c.normalization;
  s.norm_eps = c.norm_epsilon;
  s.attn = {c.hidden_size, c.num_attention_heads, c.num_query_groups, c.head_dim()};
  s.mla = c.mla;
  s.softmax_scale = c.softmax_scale();
  s.ffn_hidden = c.ffn_hidden_size;
  s.activation = c.activation;
  s.moe = c.moe;
  s.bias = c.add_bias_linear;
  s.tp = tp;
  s.ep = ep;
  return s;
}

const TransformerConfig& validated(const TransformerConfig& c) {
  c.validate();
  return c;
}
}  // namespace

TransformerModel::TransformerModel(const TransformerConfig& config, int64_t num_chunks, const nn::TensorParallel& tp)
    : TransformerModel(config, StageLayout::whole(config.num_layers, num_chunks), tp) {}

TransformerModel::TransformerModel(const TransformerConfig& config, StageLayout layout, const nn::TensorParallel& tp,
                                   const nn::ExpertParallel& ep)
    : config_(validated(config)), tp_(tp), ep_(ep), layout_(std::move(layout)) {
  layout_.validate(config.num_layers);
  const bool rope = config.position_embedding == PositionEmbedding::Rope;
  if (rope) {
    const int64_t P = config.max_position_embeddings, D = config.rope_dim();
    rope_.cos = Tensor::empty({P, D / 2}, DType::F32, MemCategory::Workspace, "rope.cos");
    rope_.sin = Tensor::empty({P, D / 2}, DType::F32, MemCategory::Workspace, "rope.sin");
    rope_.layout = config.rope_layout;
    kernels::rope_tables(kernels::ExecContext::on(rope_.cos), rope_.cos, rope_.sin,
                         kernels::rope_inv_freq(D, config.rotary_base, config.rope_scaling),
                         kernels::rope_magnitude(config.rope_scaling));
  }
  const int64_t L = config.num_layers;
  const size_t last = layout_.num_chunks() - 1;
  const auto add = [&](auto& module, int64_t position) {
    const size_t before = params_.size();
    module.parameters(params_);
    positions_.resize(params_.size(), position);
    return before;
  };
  if (layout_.holds(0)) {
    embedding_ = std::make_unique<nn::Embedding>(config.vocab_size, config.padded_vocab_size(tp.size()),
                                                 config.hidden_size, config.max_position_embeddings,
                                                 config.position_embedding == PositionEmbedding::LearnedAbsolute, tp);
    add(*embedding_, -1);
  }
  nn::BlockSpec spec = block_spec(config, tp, ep);
  for (int64_t i = 0; i < L; ++i) {
    if (!layout_.holds(layout_.chunk_of(i))) continue;
    spec.mlp = config.mlp_type == "moe" && !config.is_moe_layer(i) ? "dense" : config.mlp_type;
    layers_.push_back(std::make_unique<nn::TransformerBlock>("decoder.layers." + std::to_string(i), spec,
                                                             rope ? &rope_ : nullptr));
    layer_numbers_.push_back(i);
    add(*layers_.back(), i);
  }
  if (layout_.holds(last)) {
    final_norm_ = std::make_unique<nn::Norm>("decoder.final_layernorm", config.hidden_size, config.normalization,
                                             config.norm_epsilon, tp.splits_sequence());
    // Tied without the embedding here: the head's weight is a copy of it (summed gradients keep
    // the copies equal).
    const bool copy = config.tie_embeddings && !embedding_;
    head_ = std::make_unique<nn::OutputHead>(config.hidden_size, config.vocab_size,
                                             config.padded_vocab_size(tp.size()),
                                             config.tie_embeddings && embedding_ ? &embedding_->word : nullptr, tp, copy);
    add(*final_norm_, L);
    const size_t head_at = add(*head_, L);
    if (copy) positions_.at(head_at) = -1;
  }
  if (config.mtp_num_layers > 0) {
    if (!embedding_ || !head_)
      fail("mtp_num_layers ", config.mtp_num_layers, ": multi-token prediction needs the whole model on one pipeline "
           "stage (pipeline_model_parallel_size 1)");
    // The block of depth k is a decoder layer past the last one: MoE when the model's later layers are.
    spec.mlp = config.is_moe_layer(L) ? config.mlp_type : "dense";
    for (int64_t k = 0; k < config.mtp_num_layers; ++k) {
      mtp_.push_back(std::make_unique<nn::MtpLayer>("mtp.layers." + std::to_string(k), spec, rope ? &rope_ : nullptr));
      add(*mtp_.back(), L);
    }
    // Each depth looks the embedding up once more and runs the head once more per micro-batch.
    embedding_->word.uses += static_cast<int>(config.mtp_num_layers);
    head_->weight().uses += static_cast<int>(config.mtp_num_layers);
  }
  size_t local_layer = 0;
  for (size_t c = 0; c < layout_.num_chunks(); ++c) {
    if (!layout_.holds(c)) {
      chunk_index_.push_back(-1);
      continue;
    }
    const auto n = static_cast<size_t>(layout_.chunk_layers[c]);
    chunk_index_.push_back(static_cast<int>(chunks_.size()));
    chunks_.emplace_back(c == 0 ? embedding_.get() : nullptr, ModelChunk::Layers(layers_).subspan(local_layer, n),
                         c == last ? final_norm_.get() : nullptr, c == last ? head_.get() : nullptr);
    local_layer += n;
  }
}

nn::Embedding& TransformerModel::embedding() {
  MEGATON_CHECK(embedding_, "pipeline rank ", layout_.rank(), " does not hold the embedding (model chunk 0)");
  return *embedding_;
}

nn::Norm& TransformerModel::final_norm() {
  MEGATON_CHECK(final_norm_, "pipeline rank ", layout_.rank(), " does not hold the final norm (the last model chunk)");
  return *final_norm_;
}

nn::OutputHead& TransformerModel::head() {
  MEGATON_CHECK(head_, "pipeline rank ", layout_.rank(), " does not hold the output head (the last model chunk)");
  return *head_;
}

ModelChunk& TransformerModel::chunk(size_t c) {
  MEGATON_CHECK(c < chunk_index_.size() && chunk_index_[c] >= 0, "pipeline rank ", layout_.rank(),
                " does not hold model chunk ", c, " of ", chunk_index_.size());
  return chunks_.at(static_cast<size_t>(chunk_index_[c]));
}

void TransformerModel::check_whole(const char* what) const {
  if (layout_.split())
    fail(what, " needs the whole model, but pipeline rank ", layout_.rank(), " holds only its stage's model chunks");
}

nn::Parameter* TransformerModel::embedding_group_weight() {
  const int first = layout_.holder(-1), last = layout_.holder(config_.num_layers);
  // Both here (DualPipe's end stages hold a copy of each): the head reads the embedding itself.
  if (!config_.tie_embeddings || first == last || (embedding_ && head_)) return nullptr;
  if (layout_.rank() == first) return &embedding_->word;
  if (layout_.rank() == last) return &head_->weight();
  return nullptr;
}

void TransformerModel::init_weights(uint64_t seed) {
  const double std = config_.init_method_std;
  const double out_std = std / std::sqrt(2.0 * static_cast<double>(config_.num_layers));
  auto ends_with = [](const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for (nn::Parameter* p : params_) {
    // The whole tensor's values, then this rank's slice of them (padding zero).
    const bool whole = nn::holds_global(*p);
    const Tensor global =
        whole ? p->value : Tensor::empty(nn::global_shape(*p), DType::F32, MemCategory::Workspace, p->name);
    float* v = global.data<float>();
    const int64_t n = global.numel();
    Philox rng(seed, stable_hash(p->name.data(), p->name.size()));
    if (ends_with(p->name, "norm.weight")) {  // every norm: layernorm, q_ / kv_layernorm, MTP's enorm / hnorm
      std::fill(v, v + n, 1.0f);
    } else if (ends_with(p->name, ".bias") || ends_with(p->name, ".expert_bias")) {
      std::fill(v, v + n, 0.0f);
    } else {
      const bool scaled = ends_with(p->name, "linear_proj.weight") || ends_with(p->name, "linear_fc2.weight");
      fill_normal(v, n, rng, 0.0f, static_cast<float>(scaled ? out_std : std));
    }
    if (!whole) nn::slice_global(*p, global, p->value);
  }
}

std::vector<nn::MoeLayer*> TransformerModel::moe_layers() {
  std::vector<nn::MoeLayer*> out;
  for (auto& l : layers_)
    if (auto* m = dynamic_cast<nn::MoeLayer*>(l->mlp.get())) out.push_back(m);
  for (auto& d : mtp_)
    if (auto* m = dynamic_cast<nn::MoeLayer*>(d->block.mlp.get())) out.push_back(m);
  return out;
}

void TransformerModel::set_moe_aux_loss_grad_scale(double scale) {
  for (nn::MoeLayer* m : moe_layers()) m->set_aux_loss_grad_scale(scale);
}

void TransformerModel::begin_moe_step() {
  for (nn::MoeLayer* m : moe_layers()) m->begin_step();
}

std::vector<nn::MoeStats> TransformerModel::moe_step_stats() {
  std::vector<nn::MoeStats> out;
  for (nn::MoeLayer* m : moe_layers()) out.push_back(m->step_stats());
  return out;
}

void TransformerModel::update_moe_expert_bias(const std::vector<parallel::Communicator*>& groups) {
  for (nn::MoeLayer* m : moe_layers()) m->update_expert_bias(groups);
}

nn::ParameterList TransformerModel::gemm_weights() {
  nn::ParameterList weights;
  if (head_) weights.push_back(&head_->weight());
  for (auto& l : layers_) l->gemm_weights(weights);
  for (auto& d : mtp_) d->gemm_weights(weights);
  return weights;
}

void TransformerModel::set_compute_dtype(DType dtype) {
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16)
    fail("compute dtype ", dtype_name(dtype), " is not supported (f32, bf16 or f16)");
  const nn::ParameterList weights = gemm_weights();
  // A quantised tied head computes from its codes; in f32 its value is read by the embedding lookup
  // alone, which reads a bf16 table too.
  for (nn::Parameter* p : weights)
    if (p->value.dtype() != DType::F32 && p->value.dtype() != dtype && keeps_compute_copy(*p) &&
        !(p->quantized && dtype == DType::F32))
      fail("weight '", p->name, "' is held in ", dtype_name(p->value.dtype()), " only (a model loaded to serve in ",
           dtype_name(p->value.dtype()), "): it cannot compute in ", dtype_name(dtype));
  compute_dtype_ = dtype;
  for (ModelChunk& c : chunks_) c.set_compute_dtype(dtype);
  for (nn::Parameter* p : weights) {
    if (dtype == DType::F32 || !keeps_compute_copy(*p))
      p->compute = {};
    else if (p->value.dtype() == dtype)
      p->compute = p->value;
    else
      nn::add_compute_copy(*p, dtype);
  }
}

void TransformerModel::set_fusion(const nn::FusionConfig& config) {
  for (auto& l : layers_) l->set_fusion(config);
}

void TransformerModel::set_recompute(const nn::RecomputeConfig& config) {
  for (ModelChunk& c : chunks_) c.set_recompute(config);
  for (auto& l : layers_) l->set_recompute(config);
}

void TransformerModel::install_quantized_weights(kernels::WeightQuant q, const StoredQuantizedWeights& stored) {
  check_whole("TransformerModel::quantize_weights");
  if (tp_.active()) fail("quantised inference weights need the whole model in one process (tensor parallelism is on)");
  for (nn::Parameter* p : quantizable_weights()) {
    if (const auto it = stored.find(p); it != stored.end()) {
      p->quantized = it->second;
    } else {
      // The quantiser reads bf16 itself: a bf16-only value (a tied head served in bf16) is not widened whole.
      const Tensor w = p->value.dtype() == DType::BF16 ? p->value : nn::f32_values(*p);
      p->quantized = std::make_shared<const kernels::QuantizedWeight>(kernels::quantize_weight(w, q));
    }
    if (keeps_compute_copy(*p)) continue;
    // Held as its codes alone, as a quantised folder's weights load (nn::f32_values dequantises on
    // demand): the fp32 values are freed (llama3-1b with int8 codes: 6.2 -> 5.0 GB resident, 2.4 once
    // Allocator::empty_cache hands glibc's free blocks back).
    p->compute = {};
    p->value = p->quantized->codes;
  }
}

std::vector<nn::Parameter*> TransformerModel::quantizable_weights() {
  std::vector<nn::Parameter*> weights;
  for (nn::Linear* l : layer_linears()) weights.push_back(&l->weight);
  weights.push_back(&head().weight());
  return weights;
}

bool TransformerModel::keeps_compute_copy(const nn::Parameter& p) {
  // A tied head's weight is the embedding's too, whose lookup reads the compute copy.
  return !p.quantized || (config_.tie_embeddings && &p == &head().weight());
}

std::vector<nn::Linear*> TransformerModel::layer_linears() {
  std::vector<nn::Linear*> linears;
  for (auto& l : layers_) l->linears(linears);
  return linears;
}

void TransformerModel::enable_fp8(const fp8::Fp8Config& config, int64_t first_layer, int64_t end_layer) {
  fp8_setting_ = Fp8Setting{config, first_layer, end_layer};
  for (size_t k = 0; k < layers_.size(); ++k) {
    if (layer_numbers_[k] < first_layer || layer_numbers_[k] >= end_layer) continue;
    std::vector<nn::Linear*> linears;
    layers_[k]->linears(linears);
    for (nn::Linear* l : linears) l->enable_fp8(config);
  }
}

std::vector<fp8::LinearQuantizer*> TransformerModel::fp8_quantizers() {
  std::vector<fp8::LinearQuantizer*> out;
  for (nn::Linear* l : layer_linears())
    if (l->fp8()) out.push_back(l->fp8());
  return out;
}

std::vector<const fp8::LinearQuantizer*> TransformerModel::fp8_quantizers() const {
  // The same walk over the layers, read-only (it changes nothing).
  const auto quantizers = const_cast<TransformerModel*>(this)->fp8_quantizers();
  return {quantizers.begin(), quantizers.end()};
}

LossResult TransformerModel::forward(ModelCtx& ctx, const Tensor& tokens, const Tensor& targets, bool compute_grad,
                                     float loss_scale, bool defer_head_weight_grad) {
  check_whole("TransformerModel::forward");
  const int64_t B = tokens.size(0), T = tokens.size(1);
  targets.expect_shape(tokens.shape());
  ctx.chunks.clear();  // contexts are move-only: start from fresh ones
  ctx.chunks.resize(chunks_.size());
  Tensor h = tokens;
  for (size_t c = 0; c < chunks_.size(); ++c) h = chunks_[c].forward(ctx.chunks[c], h, B, T);
  return loss(ctx, h, targets, compute_grad, loss_scale, defer_head_weight_grad);
}

LossResult TransformerModel::loss(ModelCtx& ctx, const Tensor& output, const Tensor& targets, bool compute_grad,
                                  float loss_scale, bool defer_head_weight_grad) {
  MEGATON_CHECK(ctx.chunks.size() == num_chunks(), "loss without a forward of every chunk on this context");
  const int64_t count = compute_grad ? nn::count_targets(targets) : 0;
  const float scale = count ? loss_scale / static_cast<float>(count) : 0.0f;
  const nn::LossSum s =
      chunk(num_chunks() - 1).loss(ctx.chunks.back(), output, targets, compute_grad, scale, defer_head_weight_grad);
  if (compute_grad && !mtp_.empty()) mtp_loss_and_grad(ctx, output, targets, loss_scale);
  if (!compute_grad) ctx = {};
  return {s.count ? s.sum / static_cast<double>(s.count) : 0.0, s.count};
}

void TransformerModel::backward(ModelCtx& ctx) {
  check_whole("TransformerModel::backward");
  MEGATON_CHECK(ctx.chunks.size() == chunks_.size(), "backward without a training forward on this context");
  Tensor d;  // the last chunk takes its gradient from the loss op
  for (size_t c = chunks_.size(); c-- > 0;) d = chunks_[c].backward(ctx.chunks[c], d);
  ctx = {};
}

void TransformerModel::backward_input(ModelCtx& ctx) {
  check_whole("TransformerModel::backward_input");
  MEGATON_CHECK(ctx.chunks.size() == chunks_.size(), "backward_input without a training forward on this context");
  Tensor d;
  for (size_t c = chunks_.size(); c-- > 0;) d = chunks_[c].backward_input(ctx.chunks[c], d);
}

void TransformerModel::backward_weight(ModelCtx& ctx) {
  check_whole("TransformerModel::backward_weight");
  MEGATON_CHECK(ctx.chunks.size() == chunks_.size(), "backward_weight before backward_input on this context");
  for (size_t c = chunks_.size(); c-- > 0;) chunks_[c].backward_weight(ctx.chunks[c]);
  ctx = {};
}

std::vector<nn::KVCache> TransformerModel::new_kv_caches(int64_t B, int64_t max_len) const {
  check_whole("incremental decoding");
  std::vector<nn::KVCache> caches;
  for (const auto& l : layers_) caches.push_back(l->attention->new_cache(B, max_len, kv_cache_dtype()));
  return caches;
}

void TransformerModel::set_kv_cache_dtype(DType dtype) {
  if (dtype != DType::F32 && dtype != DType::BF16)
    fail("a KV cache for incremental decoding holds f32 or bf16, not ", dtype_name(dtype));
  kv_cache_dtype_ = dtype;
}

DType TransformerModel::kv_cache_dtype() const {
  return kv_cache_dtype_.value_or(compute_dtype_ == DType::BF16 ? DType::BF16 : DType::F32);
}

Tensor TransformerModel::decoder_cached(std::vector<nn::KVCache>& caches, const Tensor& tokens) {
  if (tp_.active()) fail("incremental decoding runs on an unsharded model, this one is split over ", tp_.size(), " ranks");
  const int64_t B = tokens.size(0), T = tokens.size(1);
  check_whole("incremental decoding");
  Tensor h = embedding_->forward(tokens, caches.at(0).len, compute_dtype_);
  for (size_t i = 0; i < layers_.size(); ++i) h = layers_[i]->forward_cached(caches[i], h, B, T);
  return h;
}

Tensor TransformerModel::forward_cached_hidden(std::vector<nn::KVCache>& caches, const Tensor& tokens) {
  nn::NormCtx scratch;
  return final_norm_->forward(scratch, decoder_cached(caches, tokens));
}

Tensor TransformerModel::logits(const Tensor& hidden) { return head_->logits(hidden); }

nn::KVCache TransformerModel::new_mtp_cache(int64_t B, int64_t max_len) const {
  if (mtp_.empty()) fail("model '", config_.name, "' has no multi-token prediction layers (mtp_num_layers 0)");
  return mtp_.front()->block.attention->new_cache(B, max_len, kv_cache_dtype());
}

Tensor TransformerModel::mtp_forward_cached(nn::KVCache& cache, const Tensor& next, const Tensor& hidden) {
  if (mtp_.empty()) fail("model '", config_.name, "' has no multi-token prediction layers (mtp_num_layers 0)");
  const int64_t B = next.size(0), T = next.size(1);
  return mtp_.front()->forward_cached(cache, embedding_->forward(next, 0, compute_dtype_), hidden, B, T);
}

bool TransformerModel::supports_paged_kv() const {
  return !tp_.active() && std::all_of(layers_.begin(), layers_.end(), [](const auto& l) { return l->attention->paged(); });
}

nn::PagedKVCache TransformerModel::new_paged_kv_cache(int64_t num_pages, int64_t page_size, DType dtype) const {
  check_whole("paged decoding");
  std::vector<nn::PagedLayerSpec> specs;
  for (const auto& l : layers_) specs.push_back(l->attention->paged_layer());
  return nn::PagedKVCache(specs, num_pages, page_size, dtype);
}

Tensor TransformerModel::forward_paged(nn::PagedKVCache& cache, const std::vector<nn::PagedSequence*>& seqs,
                                       const Tensor& tokens) {
  if (tp_.active()) fail("paged decoding runs on an unsharded model, this one is split over ", tp_.size(), " ranks");
  check_whole("paged decoding");
  const int64_t S = tokens.size(0), T = tokens.size(1), C = config_.hidden_size;
  if (S != static_cast<int64_t>(seqs.size()) || cache.num_layers() != layers_.size())
    fail("paged step: ", S, " token rows for ", seqs.size(), " sequences, a cache of ", cache.num_layers(),
         " layers for ", layers_.size());
  const nn::PagedBatch batch(seqs, T, cache.page_size());
  for (const nn::PagedSequence* s : seqs)
    if (s->len + T > config_.max_position_embeddings)
      fail("paged step: position ", s->len + T, " beyond the model's ", config_.max_position_embeddings);
  // Each sequence's embedding at its own positions, into its rows.
  Tensor h = nn::new_activation({S * T, C}, "paged_hidden", compute_dtype_);
  const auto on = kernels::ExecContext::on(h);
  for (int64_t s = 0; s < S; ++s) {
    const Tensor e = embedding_->forward(tokens.slice_rows(s, s + 1), seqs[static_cast<size_t>(s)]->len, compute_dtype_);
    kernels::copy_rows(on, {h.view({1, S * T, C}), s * T, 0}, {e.view({1, T, C}), 0, 0}, T, C);
  }
  for (size_t i = 0; i < layers_.size(); ++i) h = layers_[i]->forward_paged(cache.layer(i), batch, h);
  for (nn::PagedSequence* s : seqs) s->len += T;
  return last_position_logits(h, S, T);
}

Tensor TransformerModel::forward_cached(std::vector<nn::KVCache>& caches, const Tensor& tokens) {
  return last_position_logits(decoder_cached(caches, tokens), tokens.size(0), tokens.size(1));
}

Tensor TransformerModel::last_position_logits(const Tensor& h, int64_t B, int64_t T) {
  const int64_t C = config_.hidden_size;
  // Only the last position of each sequence needs the final norm and logits; the gather and the head
  // run in the compute dtype (a bf16 model reads the head's bf16 copy: half the bytes of its largest
  // weight per token).
  Tensor last = nn::new_activation({B, C}, "last_hidden", h.dtype());
  kernels::copy_rows(kernels::ExecContext::on(h), {last.view({B, 1, C}), 0, 0}, {h.view({B, T, C}), T - 1, 0}, 1, C);
  nn::NormCtx scratch;
  return head_->logits(final_norm_->forward(scratch, last));
}

}  // namespace megaton::models
