// Moving a parameter between its per-rank shards (ShardSpec, parameter.h) and its global,
// layout-free tensor: what checkpoints, rewind points, the HF export and the initialisation see,
// so a run saved at one tensor-parallel size loads at another. Also which of a rank's elements
// count in a global norm (each global element once: replicated parameters and replicated k / v
// heads on their lowest rank only, padding nowhere) and the gradient sums of the elements several
// ranks hold.
#pragma once
#include <utility>
#include <vector>

#include "megaton/nn/tensor_parallel.h"

namespace megaton::nn {

// The global tensor's shape: the local shape with the partition dim's extent global_size.
Shape global_shape(const Parameter& p);
// Whether the local tensor is the global tensor itself (no split, no padding).
bool holds_global(const Parameter& p);

// The global tensor assembled from every rank's `local` (a tensor of p's local shape: its value,
// its gradient or an optimizer moment). Collective over the group p is split over (tp, or ep for
// the routed experts) when it has more than one rank; `local` itself when holds_global(p).
Tensor gather_global(const Parameter& p, const Tensor& local, const ShardGroups& groups);
// local = this rank's pieces of `global` (padding zero).
void slice_global(const Parameter& p, const Tensor& global, const Tensor& local);

// (offset, count) runs of p's local elements that count towards a global norm on this rank of its
// group (a replicated parameter on tensor-parallel rank 0 only; an expert-parallel split: each
// rank's own experts, to be summed over the ep group).
std::vector<std::pair<int64_t, int64_t>> counted_elements(const Parameter& p, const TensorParallel& tp);
// After backward: sums over tp the gradient elements several ranks compute parts of (partial_grad
// parameters; k / v heads replicated over ranks). Collective over tp for every parameter that has
// any; nothing for the others.
void sum_shared_grads(const Parameter& p, const TensorParallel& tp);
// Whether sum_shared_grads has anything to do for p.
bool has_shared_grads(const Parameter& p);

}  // namespace megaton::nn
