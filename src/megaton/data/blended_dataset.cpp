#include "megaton/data/blended_dataset.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "megaton/core/error.h"

namespace megaton::data {

std::vector<double> normalize_weights(std::vector<double> weights) {
  if (weights.empty()) fail("blend: no weights");
  for (double w : weights)
    if (!(w >= 0) || !std::isfinite(w)) fail("blend: weight ", w, " is not a finite non-negative number");
  // Summed in order, as numpy sums a short float64 array, so normalised weights match Megatron's bit for bit.
  const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  if (sum <= 0) fail("blend: the weights sum to zero");
  for (double& w : weights) w /= sum;
  return weights;
}

namespace {

// How far a source with this weight is behind its share after `drawn` samples, `taken` of them its own.
// The product is rounded before the subtraction, as in Megatron's helpers.cpp (built with -std=c++11,
// which keeps the compiler from fusing them): a fused multiply-subtract, which -march=native lets the
// compiler form here, breaks exact ties such as 0.7 * 10 - 7 == 0.3 * 10 - 3 the other way.
double shortfall(double weight, double drawn, int64_t taken) {
  const volatile double share = weight * drawn;
  return share - static_cast<double>(taken);
}

}  // namespace

BlendingIndices build_blending_indices(std::span<const double> weights, int64_t size) {
  if (weights.size() > static_cast<size_t>(std::numeric_limits<int16_t>::max()))
    fail("blend: ", weights.size(), " datasets, more than the ", std::numeric_limits<int16_t>::max(), " supported");
  BlendingIndices out;
  out.dataset_index.resize(static_cast<size_t>(size));
  out.dataset_sample_index.resize(static_cast<size_t>(size));
  std::vector<int64_t> taken(weights.size(), 0);
  for (int64_t i = 0; i < size; ++i) {
    // As in Megatron, the first sample is chosen as if one had already been drawn.
    const double drawn = std::max(static_cast<double>(i), 1.0);
    size_t best = 0;
    double best_error = shortfall(weights[0], drawn, taken[0]);
    for (size_t d = 1; d < weights.size(); ++d) {
      const double error = shortfall(weights[d], drawn, taken[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    out.dataset_index[static_cast<size_t>(i)] = static_cast<int16_t>(best);
    out.dataset_sample_index[static_cast<size_t>(i)] = taken[best]++;
  }
  return out;
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const SampleSource>> sources, std::vector<double> weights,
                               int64_t size)
    : sources_(std::move(sources)), weights_(normalize_weights(std::move(weights))) {
  if (sources_.size() != weights_.size())
    fail("blend: ", sources_.size(), " datasets but ", weights_.size(), " weights");
  for (size_t d = 0; d < sources_.size(); ++d)
    if (sources_[d]->seq_length() != sources_[0]->seq_length())
      fail("blend: dataset ", d, " has seq_length ", sources_[d]->seq_length(), ", dataset 0 has ",
           sources_[0]->seq_length());
  indices_ = build_blending_indices(weights_, size);
  std::vector<int64_t> needed(sources_.size(), 0);
  for (int16_t d : indices_.dataset_index) ++needed[static_cast<size_t>(d)];
  for (size_t d = 0; d < sources_.size(); ++d)
    if (needed[d] > sources_[d]->size())
      fail("blend: dataset ", d, " (weight ", weights_[d], ") has ", sources_[d]->size(), " samples but the blend of ",
           size, " draws ", needed[d], " from it");
}

void BlendedDataset::read(int64_t i, int32_t* out) const {
  if (i < 0 || i >= size()) fail("blended dataset: sample ", i, " out of range (", size(), " samples)");
  const auto k = static_cast<size_t>(i);
  sources_[static_cast<size_t>(indices_.dataset_index[k])]->read(indices_.dataset_sample_index[k], out);
}

}  // namespace megaton::data
