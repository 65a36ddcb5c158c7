#include "megaton/nn/output_head.h"

#include <algorithm>

#include <limits>

#include "megaton/kernels/copy.h"
#include "megaton/kernels/cross_entropy.h"
#include "megaton/kernels/linear.h"
#include "megaton/kernels/quantized_linear.h"
#include "megaton/kernels/reduce.h"
#include "megaton/nn/linear.h"
#include "megaton/parallel/tensor_parallel_mappings.h"

namespace megaton::nn {

namespace {
// Rows per chunk: large enough for efficient GEMMs (K = chunk in dW += dlogits^T x), small
// enough that a chunk of logits (chunk x vocab floats) stays a modest buffer.
constexpr int64_t kChunkRows = 256;
}  // namespace

OutputHead::OutputHead(int64_t hidden, int64_t vocab, int64_t padded_vocab, Parameter* tied, const TensorParallel& tp,
                       bool embedding_copy)
    : hidden_(hidden), vocab_(vocab), tp_(tp), tied_(tied) {
  auto pieces = even_pieces({padded_vocab}, tp.size(), "padded vocabulary");
  const ShardPiece mine = pieces.at(static_cast<size_t>(tp.rank())).front();
  local_vocab_ = mine.length;
  vocab_start_ = mine.start;
  if (tied) {
    MEGATON_CHECK(tied->value.shape() == Shape({local_vocab_, hidden}), "output head tied to '", tied->name, "' ",
                  shape_str(tied->value.shape()), ", expected ", shape_str({local_vocab_, hidden}));
    ++tied->uses;  // the embedding's gradient is final only after both the head and the embedding added theirs
  } else {
    MEGATON_CHECK(!embedding_copy || !tied, "an output head is tied to the embedding or holds a copy of it, not both");
    own_ = Parameter(embedding_copy ? "embedding.word_embeddings.weight" : "output_layer.weight", {local_vocab_, hidden},
                     !embedding_copy, split_spec(0, vocab, tp, std::move(pieces)));
  }
}

void OutputHead::mask_padding(const Tensor& logits) const {
  const int64_t from = std::clamp<int64_t>(vocab_ - vocab_start_, 0, local_vocab_);
  if (from < local_vocab_)
    kernels::fill_columns(kernels::ExecContext::on(logits), logits, from, -std::numeric_limits<double>::infinity());
}

int64_t count_targets(const Tensor& targets) {
  return kernels::count_not_equal(kernels::ExecContext::on(targets), targets, kernels::kIgnoreIndex);
}

LossSum OutputHead::run(const Tensor& x_in, const Tensor& targets, float grad_scale, Tensor* dx, HeadCtx* deferred) {
  if (weight().quantized) fail("loss: the output head's weight is quantised for inference (logits only)");
  // Sequence parallelism: the loss needs every row (the targets are the whole micro-batch's).
  const Tensor x = tp_.splits_sequence() ? parallel::gather_rows(*tp_.group, x_in, "output_layer.x") : x_in;
  const int64_t N = rows_of(x);
  const auto on = kernels::ExecContext::on(x);
  if (targets.numel() != N) fail("loss: ", targets.numel(), " targets for ", N, " rows of '", x.name(), "'");
  const int64_t bad = kernels::first_out_of_range(on, targets, vocab_, kernels::kIgnoreIndex);
  if (bad >= 0)
    fail("target id ", targets.data<int32_t>()[bad], " at row ", bad, " is outside the model's vocabulary of ", vocab_);
  const Tensor flat_targets = targets.view({N});
  const Tensor x2 = x.view({N, hidden_});
  const DType dt = x.dtype();
  const Tensor& w = weight().weight_in(dt);
  const int64_t chunk = std::min(N, kChunkRows);
  // The GEMM writes logits in x's dtype, into a buffer of every row when W is deferred (each
  // chunk's dlogits stay there for W) or of one chunk. The cross-entropy math is fp32 whatever the
  // logits' dtype (with bf16 x, Megatron's upcast of the logits): its kernels widen each bf16 logit
  // as they read it and round the gradient as they write it, in place.
  const int64_t V = local_vocab_;
  const Tensor gemm_buf = Tensor::empty({deferred ? N : chunk, V}, dt,
                                        deferred ? MemCategory::Activations : MemCategory::Workspace,
                                        deferred ? "output_layer.dlogits" : "output_layer.logits");
  const Tensor dxg = dx ? new_activation({N, hidden_}, "output_layer.dx", dt) : Tensor();  // every row's
  const auto per_row = [&](const char* name) { return Tensor::empty({chunk}, DType::F32, MemCategory::Workspace, name); };
  const Tensor losses = per_row("output_layer.losses"), lse = per_row("output_layer.lse");
  const Tensor row_max = per_row("output_layer.row_max"), sum_exp = per_row("output_layer.sum_exp");
  const Tensor target_logit = per_row("output_layer.target_logit");
  LossSum total;
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t n = std::min(chunk, N - r0);
    const Tensor xr = x2.slice_rows(r0, r0 + n);
    const int64_t at = deferred ? r0 : 0;  // this chunk's first row in gemm_buf
    const Tensor g = gemm_buf.slice_rows(at, at + n);  // the logits, then their gradient
    const Tensor tg = flat_targets.slice_rows(r0, r0 + n);
    const auto rows = [n](const Tensor& t) { return t.slice_rows(0, n); };
    kernels::linear_forward(on, g, xr, w, Tensor());
    mask_padding(g);
    // With the vocabulary split over tensor-parallel ranks: the row max and the sums over the group.
    kernels::cross_entropy_row_max(on, rows(row_max), g);
    if (tp_.active()) parallel::reduce_from_region(*tp_.group, rows(row_max), parallel::ReduceOp::Max);
    kernels::cross_entropy_sum_exp(on, rows(sum_exp), rows(target_logit), g, rows(row_max), tg, vocab_start_);
    if (tp_.active()) {
      parallel::reduce_from_region(*tp_.group, rows(sum_exp));
      parallel::reduce_from_region(*tp_.group, rows(target_logit));
    }
    kernels::cross_entropy_loss(on, rows(losses), rows(lse), rows(row_max), rows(sum_exp), rows(target_logit), tg);
    total.sum += kernels::sum(on, rows(losses));
    total.count += count_targets(tg);
    if (!dx) continue;
    kernels::cross_entropy_backward(on, g, g, rows(lse), tg, vocab_start_, grad_scale);
    kernels::linear_backward_input(on, dxg.slice_rows(r0, r0 + n), g, w);
    if (!deferred) kernels::linear_backward_weight(on, weight().grad, Tensor(), g, xr);
  }
  if (deferred)
    *deferred = {x2, gemm_buf};
  else if (dx)
    weight().grad_accumulated();
  if (!dx) return total;
  // The input gradient leaves the tensor-parallel region: summed over the ranks' vocabulary parts.
  if (!tp_.active())
    *dx = dxg;
  else if (tp_.sequence_parallel)
    *dx = parallel::reduce_scatter_rows(*tp_.group, dxg, "output_layer.dx");
  else
    parallel::reduce_from_region(*tp_.group, *dx = dxg);
  return total;
}

void OutputHead::backward_weight(HeadCtx& ctx) {
  MEGATON_CHECK(ctx.dlogits.defined(), "output head backward_weight without a deferred loss_and_grad");
  const auto on = kernels::ExecContext::on(ctx.x);
  const int64_t N = ctx.x.size(0);
  // The same chunks as the eager path, so the accumulation is bitwise the same.
  for (int64_t r0 = 0; r0 < N; r0 += kChunkRows) {
    const int64_t r1 = std::min(N, r0 + kChunkRows);
    kernels::linear_backward_weight(on, weight().grad, Tensor(), ctx.dlogits.slice_rows(r0, r1),
                                    ctx.x.slice_rows(r0, r1));
  }
  weight().grad_accumulated();
  ctx = {};
}

LossSum OutputHead::loss(const Tensor& x, const Tensor& targets) { return run(x, targets, 0.0f, nullptr, nullptr); }

LossSum OutputHead::loss_and_grad(const Tensor& x, const Tensor& targets, float grad_scale, Tensor& dx,
                                  HeadCtx* deferred) {
  return run(x, targets, grad_scale, &dx, deferred);
}

Tensor OutputHead::logits(const Tensor& x) {
  if (tp_.active()) fail("output head: logits for generation need the unsharded head (gather the tensor-parallel shards)");
  const int64_t N = rows_of(x);
  const auto on = kernels::ExecContext::on(x);
  Tensor out = new_activation({N, local_vocab_}, "output_layer.logits", x.dtype());
  if (weight().quantized)
    kernels::quantized_linear_forward(on, out, x, *weight().quantized, Tensor());
  else
    kernels::linear_forward(on, out, x, weight().weight_in(x.dtype()), Tensor());
  out = as_dtype(out, DType::F32);  // sampling reads f32 logits
  if (local_vocab_ == vocab_) return out;
  Tensor real = new_activation({N, vocab_}, "output_layer.logits");  // without the padding columns
  kernels::copy_rows(on, {real.view({1, N, vocab_}), 0, 0}, {out.view({1, N, local_vocab_}), 0, 0}, N, vocab_);
  return real;
}

void OutputHead::parameters(ParameterList& out) {
  if (!tied_) out.push_back(&own_);
}

}  // namespace megaton::nn
