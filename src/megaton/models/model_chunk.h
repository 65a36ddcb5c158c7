// A model chunk: a contiguous range of a model's layers, preceded by the embedding on the first
// chunk and followed by the final norm on the last, with the loss as its own op on the last chunk
// (Megatron's pre_process / post_process stages). Hidden states go in and out, so a pipeline
// schedule runs forward (F), backward-input (B) and backward-weight (W) per chunk and
// micro-batch, each micro-batch keeping its activations in its own ChunkCtx. A chunk does not own
// its modules: the model does, and names them globally (checkpoint names do not depend on the
// split).
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "megaton/nn/embedding.h"
#include "megaton/nn/output_head.h"
#include "megaton/nn/recompute.h"
#include "megaton/nn/transformer_block.h"

namespace megaton::models {

struct ChunkCtx {
  int64_t B = 0, T = 0;
  Tensor tokens;  // first chunk: the input ids, which the embedding's W needs
  std::vector<nn::BlockCtx> blocks;
  // Full recompute: the input of each recomputed unit, at the index of its first layer, kept from F
  // until the unit's forward runs again right before its B (the units' block contexts are empty
  // in between).
  std::vector<Tensor> unit_inputs;
  nn::NormCtx final_norm;  // last chunk
  nn::HeadCtx head;        // last chunk, when the loss deferred the head's weight gradient
  Tensor dloss;            // last chunk: gradient at the final norm's output, from the loss op
  Tensor dembed;           // first chunk: gradient at the embedding output, from B for W
  bool input_grads_done = false;  // B ran: W may follow
};

class ModelChunk {
 public:
  using Layers = std::span<const std::unique_ptr<nn::TransformerBlock>>;
  // embedding: non-null on the first chunk; final_norm and head: non-null on the last.
  ModelChunk(nn::Embedding* embedding, Layers layers, nn::Norm* final_norm, nn::OutputHead* head);

  // The dtype the embedding output is converted to and every layer then computes in.
  void set_compute_dtype(DType dtype) { compute_dtype_ = dtype; }
  // Full recompute's units (nn/recompute.h); selective recompute is the blocks' own.
  void set_recompute(const nn::RecomputeConfig& config) { recompute_ = config; }
  // Called with each module's parameters before F (and the loss op) reads them: where weights
  // still arriving (the distributed optimizer's overlapped all-gather) are waited for.
  using ParamGate = std::function<void(const nn::ParameterList&)>;
  void set_param_gate(ParamGate gate) { gate_ = std::move(gate); }
  bool is_first() const { return embedding_ != nullptr; }
  bool is_last() const { return head_ != nullptr; }
  size_t num_layers() const { return layers_.size(); }

  // F. input: token ids [B, T] (i32) on the first chunk, else the previous chunk's output
  // [B*T, hidden]. Returns this chunk's output (on the last chunk: after the final norm).
  Tensor forward(ChunkCtx& ctx, const Tensor& input, int64_t B, int64_t T);
  // The loss op on the last chunk's output. With compute_grad it also produces the gradient of
  // grad_scale * sum(losses) at `output` (kept in ctx for B) and the head's weight gradient, now
  // or, with defer_head_weight_grad, in this chunk's W.
  nn::LossSum loss(ChunkCtx& ctx, const Tensor& output, const Tensor& targets, bool compute_grad, float grad_scale,
                   bool defer_head_weight_grad);
  // B. doutput: the next chunk's input gradient (undefined on the last chunk, which takes the loss
  // op's). Returns the gradient at this chunk's input; undefined on the first chunk, whose input
  // (token ids) has none: it keeps the embedding-output gradient for W.
  Tensor backward_input(ChunkCtx& ctx, const Tensor& doutput);
  // W: every weight gradient of the chunk in reverse order of use; empties ctx.
  void backward_weight(ChunkCtx& ctx);
  // B then W, each layer's W right after its B so its activations are freed on the way down.
  // Bitwise the same gradients as backward_input + backward_weight.
  Tensor backward(ChunkCtx& ctx, const Tensor& doutput);

 private:
  template <typename Module>
  void gate(Module& m) const {
    if (!gate_) return;
    nn::ParameterList params;
    m.parameters(params);
    gate_(params);
  }
  // The final norm's input gradient on the last chunk; doutput elsewhere.
  Tensor output_grad(ChunkCtx& ctx, const Tensor& doutput, const char* op);
  // The last chunk's W after its layers': the head's (when deferred), then the final norm's.
  void last_weight_grads(ChunkCtx& ctx);
  // The layers [first, end) of the recomputed unit holding layer i, or {0, 0} when i is kept.
  std::pair<size_t, size_t> recompute_unit(size_t i) const;
  // Before layer i's B: when i is the last layer of a recomputed unit, runs the unit's forward
  // again from its saved input, rebuilding its layers' contexts.
  void rebuild_unit(ChunkCtx& ctx, size_t i);

  nn::Embedding* embedding_;
  Layers layers_;
  nn::Norm* final_norm_;
  nn::OutputHead* head_;
  DType compute_dtype_ = DType::F32;
  nn::RecomputeConfig recompute_;
  ParamGate gate_;
};

}  // namespace megaton::models
