#include "megaton/train/evaluate.h"

#include <algorithm>

#include "megaton/core/error.h"

namespace megaton::train {

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
  model.refresh_compute_weights();
  for (int64_t s0 = 0; s0 < n; s0 += batch) {
    const int64_t B = std::min(batch, n - s0);
    Tensor inputs = Tensor::empty({B, T}, DType::I32, MemCategory::Activations, "inputs");
    Tensor targets = Tensor::empty({B, T}, DType::I32, MemCategory::Activations, "targets");
    data::read_batch(samples, s0, B, inputs.data<int32_t>(), targets.data<int32_t>());
    models::ModelCtx ctx;
    // The per-batch mean is rescaled so the accumulated gradient is that of the overall mean.
    const float scale = static_cast<float>(static_cast<double>(B * T) / static_cast<double>(total_tokens));
    models::LossResult l = model.forward(ctx, inputs, targets, accumulate_grads, scale);
    if (accumulate_grads) model.backward(ctx);
    sum += l.loss * static_cast<double>(l.tokens);
    r.tokens += l.tokens;
  }
  r.loss = sum / static_cast<double>(r.tokens);
  return r;
}

}  // namespace megaton::train
