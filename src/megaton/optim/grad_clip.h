// Global gradient-norm clipping with torch.nn.utils.clip_grad_norm_ semantics.
#pragma once
#include <vector>

#include "megaton/nn/parameter.h"

namespace megaton::optim {

// L2 norm over every gradient element of every parameter, accumulated in double. Bit-identical for
// any thread count: the grads are cut into fixed-size chunks whose sums are added in chunk order.
// NaN when any grad is NaN and +inf when any is infinite, so one check of std::isfinite on the result
// tells the trainer whether to skip the step.
double global_grad_norm(const nn::ParameterList& params);
// The same over any fp32 gradient tensors, e.g. one flat ParamAndGradBuffer::grads() (its alignment
// gaps are zero and add nothing).
double global_norm(const std::vector<Tensor>& grads);
// The sum of squares global_norm takes the root of (same order, so sqrt of it is bitwise global_norm):
// a distributed optimizer sums each rank's part over the group before the root.
double sum_of_squares(const std::vector<Tensor>& grads);

// Returns the pre-clip global norm. When max_norm > 0 and the norm is finite, multiplies every grad by
// clamp(max_norm / (norm + 1e-6), max 1) as PyTorch does (so grads shrink only when the norm exceeds
// max_norm, to within the 1e-6). max_norm <= 0 disables clipping. A non-finite norm leaves the grads
// untouched (PyTorch would turn them all into NaN); the caller is expected to skip the step.
double clip_grad_norm(const nn::ParameterList& params, double max_norm);

// The factor clip_grad_norm would multiply the grads by (1 when no clipping applies). Passing it to
// AdamW::step instead of scaling the grads saves one read and write of every gradient.
double clip_coefficient(double norm, double max_norm);

}  // namespace megaton::optim
