#include "megaton/nn/output_head.h"

#include <algorithm>

#include "megaton/kernels/cross_entropy.h"
#include "megaton/kernels/linear.h"
#include "megaton/kernels/reduce.h"
#include "megaton/nn/linear.h"

namespace megaton::nn {

namespace {
// Rows per chunk: large enough for efficient GEMMs (K = chunk in dW += dlogits^T x), small
// enough that a chunk of logits (chunk x vocab floats) stays a modest buffer.
constexpr int64_t kChunkRows = 256;
}  // namespace

OutputHead::OutputHead(int64_t hidden, int64_t vocab, Parameter* tied) : hidden_(hidden), vocab_(vocab), tied_(tied) {
  if (tied)
    ++tied->uses;  // the embedding's gradient is final only after both the head and the embedding added theirs
  else
    own_ = Parameter("output_layer.weight", {vocab, hidden}, true, ShardSpec::tensor_parallel(0));
}

int64_t count_targets(const Tensor& targets) {
  return kernels::count_not_equal(kernels::ExecContext::on(targets), targets, kernels::kIgnoreIndex);
}

LossSum OutputHead::run(const Tensor& x, const Tensor& targets, float grad_scale, Tensor* dx) {
  const int64_t N = rows_of(x);
  const auto on = kernels::ExecContext::on(x);
  if (targets.numel() != N) fail("loss: ", targets.numel(), " targets for ", N, " rows of '", x.name(), "'");
  const int64_t bad = kernels::first_out_of_range(on, targets, vocab_, kernels::kIgnoreIndex);
  if (bad >= 0)
    fail("target id ", targets.data<int32_t>()[bad], " at row ", bad, " is outside the model's vocabulary of ", vocab_);
  const Tensor flat_targets = targets.view({N});
  Parameter& w = weight();
  const int64_t chunk = std::min(N, kChunkRows);
  Tensor logits = Tensor::empty({chunk, vocab_}, DType::F32, MemCategory::Workspace, "output_layer.logits");
  Tensor losses = Tensor::empty({chunk}, DType::F32, MemCategory::Workspace, "output_layer.losses");
  Tensor lse = Tensor::empty({chunk}, DType::F32, MemCategory::Workspace, "output_layer.lse");
  LossSum total;
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t n = std::min(chunk, N - r0);
    const Tensor xr = x.view({N, hidden_}).slice_rows(r0, r0 + n);
    const Tensor lgt = logits.slice_rows(0, n);
    const Tensor tg = flat_targets.slice_rows(r0, r0 + n);
    const Tensor loss_rows = losses.slice_rows(0, n), lse_rows = lse.slice_rows(0, n);
    kernels::linear_forward(on, lgt, xr, w.value, Tensor());
    kernels::cross_entropy_forward(on, loss_rows, lse_rows, lgt, tg);
    total.sum += kernels::sum(on, loss_rows);
    total.count += count_targets(tg);
    if (!dx) continue;
    kernels::cross_entropy_backward(on, lgt, lgt, lse_rows, tg, grad_scale);
    kernels::linear_backward_input(on, dx->view({N, hidden_}).slice_rows(r0, r0 + n), lgt, w.value);
    kernels::linear_backward_weight(on, w.grad, Tensor(), lgt, xr);
  }
  if (dx) w.grad_accumulated();
  return total;
}

LossSum OutputHead::loss(const Tensor& x, const Tensor& targets) { return run(x, targets, 0.0f, nullptr); }

LossSum OutputHead::loss_and_grad(const Tensor& x, const Tensor& targets, float grad_scale, Tensor& dx) {
  dx = new_activation(x.shape(), "output_layer.dx");
  return run(x, targets, grad_scale, &dx);
}

Tensor OutputHead::logits(const Tensor& x) {
  const int64_t N = rows_of(x);
  Tensor out = new_activation({N, vocab_}, "output_layer.logits");
  kernels::linear_forward(kernels::ExecContext::on(x), out, x, weight().value, Tensor());
  return out;
}

void OutputHead::parameters(ParameterList& out) {
  if (!tied_) out.push_back(&own_);
}

}  // namespace megaton::nn
