// What a decoder block calls on its two sublayers, whatever their kind: the attention (today
// SelfAttention for MHA / GQA; multi-latent attention next) and the MLP (today the dense Mlp; a
// mixture of experts next). Each kind keeps its per-micro-batch activations in its own context type,
// created by the sublayer itself, so a block stays the same when a kind is added.
#pragma once
#include <memory>
#include <typeinfo>
#include <vector>

#include "megaton/core/error.h"
#include "megaton/nn/fused_input.h"
#include "megaton/nn/paged_kv_cache.h"
#include "megaton/nn/parameter.h"

namespace megaton::nn {

class Linear;

// Base of every sublayer's per-micro-batch context (AttentionCtx, MlpCtx, ...).
struct SublayerCtx {
  virtual ~SublayerCtx() = default;
};

// The context a sublayer of kind C expects; throws if a context of another kind was passed (a
// context from another block or a swapped attention/MLP context), which would otherwise be
// read as the wrong layout.
template <typename C>
C& ctx_as(SublayerCtx& ctx) {
  C* c = dynamic_cast<C*>(&ctx);
  MEGATON_CHECK(c != nullptr, "sublayer context of the wrong kind (expected ", typeid(C).name(), ")");
  return *c;
}

class Sublayer {
 public:
  virtual ~Sublayer() = default;
  virtual std::unique_ptr<SublayerCtx> new_ctx() const = 0;
  // x: [B*T, hidden] -> [B*T, hidden]. B and T are the micro-batch's batch and sequence sizes
  // (attention needs them; an MLP treats the rows as independent tokens).
  virtual Tensor forward(SublayerCtx& ctx, const Tensor& x, int64_t B, int64_t T) = 0;
  // The same from an input that may never be written (a norm's output, fused_input.h): kinds whose
  // first GEMM reads it alone hand it to that linear (LayerNormLinear); the others write it.
  virtual Tensor forward_fused(SublayerCtx& ctx, FusedInput& x, int64_t B, int64_t T) {
    return forward(ctx, x.written(), B, T);
  }
  // B: the input gradient; keeps in ctx what W needs.
  virtual Tensor backward_input(SublayerCtx& ctx, const Tensor& dy, int64_t B, int64_t T) = 0;
  // W: accumulates every weight gradient and frees the rest of ctx.
  virtual void backward_weight(SublayerCtx& ctx) = 0;
  virtual void parameters(ParameterList& out) = 0;
  // The weights a GEMM reads (these get a compute copy under bf16 mixed precision).
  virtual void gemm_weights(ParameterList& out) = 0;
  // The Linear layers whose GEMMs may run in FP8 (Linear::enable_fp8).
  virtual void linears(std::vector<Linear*>& out) = 0;
  // Where ctx keeps this sublayer's input as its first GEMM read it (undefined when it kept none,
  // e.g. FP8's 8-bit copy), for selective recompute of the norm before it; nullptr for kinds that
  // keep their own copies (MoE).
  virtual Tensor* kept_input(SublayerCtx& ctx) { return nullptr; }
};

// Keys and values of the tokens seen so far, for incremental decoding: [B, max_len, groups*head_dim],
// f32 or bf16 (new_cache).
struct KVCache {
  Tensor k, v;
  int64_t len = 0;
};

class AttentionLayer : public Sublayer {
 public:
  // A cache of B sequences of max_len positions whose keys and values are stored as `dtype` (f32 or
  // bf16; the attention's math stays in its compute dtype). Kinds with a cache of their own form
  // (MLA's latent, f32) ignore it.
  virtual KVCache new_cache(int64_t B, int64_t max_len, DType dtype) const = 0;
  // Inference: x holds T new tokens per sequence at positions cache.len ...; appends to the cache.
  virtual Tensor forward_cached(KVCache& cache, const Tensor& x, int64_t B, int64_t T) = 0;
  // The same over a paged cache (paged_kv_cache.h): x holds batch.tokens new tokens of each of
  // batch.seqs (its rows in sequence order), sequence s's at positions seqs[s]->len ...; writes
  // their keys and values into the sequences' pages of `layer`. paged_layer: what one token takes
  // in a page. Kinds without a paged form refuse.
  virtual bool paged() const { return false; }
  virtual PagedLayerSpec paged_layer() const { no_paged_cache(); }
  virtual Tensor forward_paged(PagedKVCache::Layer&, const PagedBatch&, const Tensor&) { no_paged_cache(); }
  // Selective recompute's "core_attn": the core's output and softmax statistics are dropped after
  // F and computed again from q, k, v before B.
  virtual void set_recompute_core(bool on) = 0;

 private:
  [[noreturn]] static void no_paged_cache() { fail("this attention kind has no paged KV cache"); }
};

using MlpLayer = Sublayer;

}  // namespace megaton::nn
