// Output layer + softmax cross-entropy, fused and chunked over rows (llm.c's fused classifier):
// per chunk, logits = x W^T, loss, dlogits in place, dx = dlogits W and dW += dlogits^T x.
// Only one chunk of logits exists at a time, so the N x vocab matrix is never stored, and the
// head's weight gradient is computed eagerly during the forward of a training step. A schedule
// that defers weight gradients (Zero Bubble) defers the head's too: then every chunk's dlogits
// is kept in a HeadCtx (N x vocab) until backward_weight, which adds the same chunk GEMMs in the
// same order (bitwise the eager result).
#pragma once
#include "megaton/nn/parameter.h"

namespace megaton::nn {

struct LossSum {
  double sum = 0;     // sum of per-token losses
  int64_t count = 0;  // tokens with a target (not kIgnoreIndex)
};

// What a deferred head weight gradient needs: the head's input and the gradient at its logits.
struct HeadCtx {
  Tensor x;        // [N, hidden]
  Tensor dlogits;  // [N, vocab]
};

class OutputHead {
 public:
  // tied: the word embedding whose value/grad this head shares; null for an own weight.
  OutputHead(int64_t hidden, int64_t vocab, Parameter* tied);
  // Loss only (evaluation). targets: i32, one per row of x (kIgnoreIndex for none).
  LossSum loss(const Tensor& x, const Tensor& targets);
  // Loss and gradients of grad_scale * sum(losses): dx (written) and the weight gradient,
  // accumulated now or, with `deferred`, kept there for backward_weight.
  LossSum loss_and_grad(const Tensor& x, const Tensor& targets, float grad_scale, Tensor& dx,
                        HeadCtx* deferred = nullptr);
  // The deferred weight gradient: dW += dlogits^T x; empties ctx.
  void backward_weight(HeadCtx& ctx);
  // Logits [N, vocab] of the given rows (generation).
  Tensor logits(const Tensor& x);
  void parameters(ParameterList& out);
  Parameter& weight() { return tied_ ? *tied_ : own_; }

 private:
  LossSum run(const Tensor& x, const Tensor& targets, float grad_scale, Tensor* dx, HeadCtx* deferred);
  int64_t hidden_, vocab_;
  Parameter* tied_;
  Parameter own_;
};

// Rows with a target (not kIgnoreIndex).
int64_t count_targets(const Tensor& targets);

}  // namespace megaton::nn
