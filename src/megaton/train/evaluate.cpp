#include "megaton/train/evaluate.h"

#include <algorithm>

#include "megaton/core/error.h"

namespace megaton::train {

namespace {

// One batch's loss through a model cut into pipeline stages: every rank walks the model chunks in
// layer order, running those it holds and handing the hidden states to the rank of the next
// (blocking: each rank waits only on earlier chunks, so the chain cannot deadlock); the holder of
// the last chunk computes the loss and broadcasts it.
models::LossResult staged_loss(models::TransformerModel& model, const Tensor& inputs, const Tensor& targets) {
  const models::StageLayout& layout = model.stage_layout();
  const int64_t B = inputs.size(0), T = inputs.size(1);
  const nn::TensorParallel& tp = model.tensor_parallel();
  const int64_t rows = tp.splits_sequence() ? B * T / tp.size() : B * T;
  models::ModelCtx ctx;
  ctx.chunks.resize(model.num_chunks());
  Tensor h = inputs;
  for (size_t c = 0; c < model.num_chunks(); ++c) {
    const int at = layout.chunk_rank[c];
    if (c > 0 && layout.chunk_rank[c - 1] != at) {
      const int tag = static_cast<int>(c);
      if (layout.rank() == layout.chunk_rank[c - 1]) layout.group->send(h, at, tag);
      if (layout.rank() == at) {
        h = Tensor::empty({rows, model.config().hidden_size}, model.compute_dtype(), MemCategory::Activations,
                          "eval.recv_activation");
        layout.group->recv(h, layout.chunk_rank[c - 1], tag);
      }
    }
    if (layout.primary(c)) h = model.chunk(c).forward(ctx.chunks[c], h, B, T);
  }
  Tensor result = Tensor::zeros({2}, DType::F64, MemCategory::Workspace, "eval.loss");
  const int last = layout.chunk_rank.back();
  if (layout.rank() == last) {
    const models::LossResult l = model.loss(ctx, h, targets, false, 1.0f, false);
    result.data<double>()[0] = l.loss;
    result.data<double>()[1] = static_cast<double>(l.tokens);
  }
  layout.group->broadcast(result, last);
  return {result.data<double>()[0], static_cast<int64_t>(result.data<double>()[1])};
}

}  // namespace

EvalResult evaluate(models::TransformerModel& model, const data::SampleSource& samples, int64_t batch,
                    int64_t max_samples, bool accumulate_grads) {
  int64_t n = samples.size();
  if (max_samples > 0) n = std::min(n, max_samples);
  if (n == 0) fail("evaluate: no samples to score");
  const int64_t T = samples.seq_length();
  EvalResult r;
  r.samples = n;
  double sum = 0;
  const int64_t total_tokens = n * T;  // every position of a sample has a target
  const bool staged = model.stage_layout().split();
  if (staged && accumulate_grads) fail("evaluate: gradients of a model cut into pipeline stages are the trainer's");
  model.refresh_compute_weights();
  for (int64_t s0 = 0; s0 < n; s0 += batch) {
    const int64_t B = std::min(batch, n - s0);
    Tensor inputs = Tensor::empty({B, T}, DType::I32, MemCategory::Activations, "inputs");
    Tensor targets = Tensor::empty({B, T}, DType::I32, MemCategory::Activations, "targets");
    data::read_batch(samples, s0, B, inputs.data<int32_t>(), targets.data<int32_t>());
    models::ModelCtx ctx;
    // The per-batch mean is rescaled so the accumulated gradient is that of the overall mean.
    const float scale = static_cast<float>(static_cast<double>(B * T) / static_cast<double>(total_tokens));
    models::LossResult l = staged ? staged_loss(model, inputs, targets)
                                  : model.forward(ctx, inputs, targets, accumulate_grads, scale);
    if (accumulate_grads) model.backward(ctx);
    sum += l.loss * static_cast<double>(l.tokens);
    r.tokens += l.tokens;
  }
  r.loss = sum / static_cast<double>(r.tokens);
  return r;
}

}  // namespace megaton::train
