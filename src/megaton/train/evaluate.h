// Mean cross-entropy of a model over the fixed-length samples of a token stream, optionally with
// the gradient of that mean with respect to every parameter (for checks against references).
#pragma once
#include "megaton/data/sample_source.h"
#include "megaton/models/transformer_model.h"

namespace megaton::train {

struct EvalResult {
  double loss = 0;
  int64_t tokens = 0;
  int64_t samples = 0;
};

// Samples 0 .. min(max_samples, size) - 1 of `samples` (max_samples <= 0: all), batch_size at a
// time. With accumulate_grads, every parameter's grad receives d(mean loss)/d(param). A model cut
// into pipeline stages is run stage after stage, the hidden states passed point to point (every
// rank of its pipeline group calls this and gets the same result; no gradients there).
EvalResult evaluate(models::TransformerModel& model, const data::SampleSource& samples, int64_t batch_size,
                    int64_t max_samples, bool accumulate_grads = false);

}  // namespace megaton::train
