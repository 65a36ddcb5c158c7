// One depth of DeepSeek-V3's multi-token prediction (Megatron-Core's MultiTokenPredictionLayer).
// Depth k predicts the token k + 1 ahead of each position: its input at position i joins the
// embedding of the token k ahead (t_{i+k}) and the previous depth's output at i (depth 1: the main
// model's final-norm output), h' = eh_proj([enorm(emb) | hnorm(h)]) (embedding first, as Megatron
// and DeepSeek's eh_proj), then one transformer block and its own final norm; the output head and
// the embedding are the model's, shared. The block keeps the full sequence (the last k positions
// see ids past the end, filled, and their targets are ignored), so causal attention stays intact.
#pragma once
#include <utility>

#include "megaton/nn/transformer_block.h"

namespace megaton::nn {

struct MtpCtx {
  NormCtx enorm, hnorm, final_norm;
  LinearCtx eh_proj;
  BlockCtx block;
};

class MtpLayer {
 public:
  // name: "mtp.layers.K"; spec: the block's (a decoder layer's spec: DeepSeek-V3's is an MoE layer).
  MtpLayer(const std::string& name, const BlockSpec& spec, const RopeTables* rope);
  // emb: the embedding of the ids k ahead, hidden: the previous depth's output, both [B*T, hidden].
  // Returns this depth's output after its final norm (the head's input and the next depth's hidden).
  Tensor forward(MtpCtx& ctx, const Tensor& emb, const Tensor& hidden, int64_t B, int64_t T);
  // Input and weight gradients in one pass: returns {d emb, d hidden}; empties ctx.
  std::pair<Tensor, Tensor> backward(MtpCtx& ctx, const Tensor& dout, int64_t B, int64_t T);
  // Decoding with the block's KV cache (speculative drafts): the output rows of x's new positions.
  Tensor forward_cached(KVCache& cache, const Tensor& emb, const Tensor& hidden, int64_t B, int64_t T);
  void parameters(ParameterList& out);
  void gemm_weights(ParameterList& out);

  Norm enorm, hnorm;
  Linear eh_proj;  // [hidden, 2 x hidden]
  TransformerBlock block;
  Norm final_norm;

 private:
  // [enorm(emb) | hnorm(hidden)] -> eh_proj; with ctx null, nothing is kept (decoding).
  Tensor combine(MtpCtx* ctx, const Tensor& emb, const Tensor& hidden);
  int64_t hidden_;
};

}  // namespace megaton::nn
