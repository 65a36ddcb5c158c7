// Output layer + softmax cross-entropy, fused and chunked over rows (llm.c's fused classifier):
// per chunk, logits = x W^T, loss, dlogits in place, dx = dlogits W and dW += dlogits^T x.
// Only one chunk of logits exists at a time, so the N x vocab matrix is never stored, and the
// head's weight gradient is computed eagerly during the forward of a training step. A schedule
// that defers weight gradients (Zero Bubble) defers the head's too: then every chunk's dlogits
// is kept in a HeadCtx (N x vocab) until backward_weight, which adds the same chunk GEMMs in the
// same order (bitwise the eager result).
//
// Over a tensor-parallel group it is Megatron's vocab-parallel output layer and cross-entropy: each
// rank holds its rows of the (padded) vocabulary, computes its columns of the logits and takes
// part in three all-reduces per chunk (MAX of the row max, SUM of the sum-exp and of the target
// logit), so the full logits never exist anywhere; the input enters the tensor-parallel region
// (all-gathered rows under sequence parallelism) and the input gradient leaves it (all-reduce, or
// reduce-scatter of the rows). The padding columns (vocabulary entries past vocab) get -inf logits:
// never predicted, no gradient.
#pragma once
#include "megaton/nn/tensor_parallel.h"

namespace megaton::nn {

struct LossSum {
  double sum = 0;     // sum of per-token losses
  int64_t count = 0;  // tokens with a target (not kIgnoreIndex)
};

// What a deferred head weight gradient needs: the head's input and the gradient at its logits.
struct HeadCtx {
  Tensor x;        // [N, hidden] (all rows under sequence parallelism)
  Tensor dlogits;  // [N, this rank's vocabulary rows]
};

class OutputHead {
 public:
  // tied: the word embedding whose value/grad this head shares (split as this head would be); null
  // for an own weight. padded_vocab: the vocabulary padded for the split. embedding_copy: the own
  // weight is a copy of a tied word embedding held elsewhere (the last pipeline stage's, Megatron's
  // shared_embedding_or_output_weight): named and decayed like the embedding, so it initialises,
  // steps and checkpoints as the same tensor.
  OutputHead(int64_t hidden, int64_t vocab, int64_t padded_vocab, Parameter* tied, const TensorParallel& tp = {},
             bool embedding_copy = false);
  // Loss only (evaluation). targets: i32, one per row of x (kIgnoreIndex for none).
  LossSum loss(const Tensor& x, const Tensor& targets);
  // Loss and gradients of grad_scale * sum(losses): dx (written) and the weight gradient,
  // accumulated now or, with `deferred`, kept there for backward_weight.
  LossSum loss_and_grad(const Tensor& x, const Tensor& targets, float grad_scale, Tensor& dx,
                        HeadCtx* deferred = nullptr);
  // The deferred weight gradient: dW += dlogits^T x; empties ctx.
  void backward_weight(HeadCtx& ctx);
  // Logits [N, vocab] of the given rows (generation; an unsharded head only).
  Tensor logits(const Tensor& x);
  void parameters(ParameterList& out);
  Parameter& weight() { return tied_ ? *tied_ : own_; }

 private:
  LossSum run(const Tensor& x, const Tensor& targets, float grad_scale, Tensor* dx, HeadCtx* deferred);
  void mask_padding(const Tensor& logits) const;  // -inf in the padding columns of the logits
  int64_t hidden_, vocab_;
  int64_t local_vocab_, vocab_start_;  // this rank's rows of the padded vocabulary
  TensorParallel tp_;
  Parameter* tied_;
  Parameter own_;
};

// Rows with a target (not kIgnoreIndex).
int64_t count_targets(const Tensor& targets);

}  // namespace megaton::nn
