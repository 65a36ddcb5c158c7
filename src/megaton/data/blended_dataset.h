// Megatron's BlendedDataset (megatron/core/datasets/blended_dataset.py, helpers.cpp build_blending_indices):
// several sample sources mixed by weight, deterministically. Sample i comes from the source whose share
// is furthest behind its weight after i samples (the first such source on ties), and is that source's
// next unused sample; so every prefix of the stream holds each source within about one sample of its
// weight, and the order is the one Megatron produces for the same weights and size.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "megaton/data/sample_source.h"

namespace megaton::data {

struct BlendingIndices {
  std::vector<int16_t> dataset_index;         // source of sample i
  std::vector<int64_t> dataset_sample_index;  // its sample within that source
};

// weights must be normalised (sum 1), as Megatron normalises them before building.
BlendingIndices build_blending_indices(std::span<const double> weights, int64_t size);

class BlendedDataset final : public SampleSource {
 public:
  // weights need not be normalised; every source must have the same seq_length and enough samples for
  // its share of size (an error names the source otherwise).
  BlendedDataset(std::vector<std::shared_ptr<const SampleSource>> sources, std::vector<double> weights, int64_t size);

  int64_t size() const override { return static_cast<int64_t>(indices_.dataset_index.size()); }
  int64_t seq_length() const override { return sources_.front()->seq_length(); }
  void read(int64_t i, int32_t* out) const override;

  const BlendingIndices& indices() const { return indices_; }
  const std::vector<double>& weights() const { return weights_; }  // normalised

 private:
  std::vector<std::shared_ptr<const SampleSource>> sources_;
  std::vector<double> weights_;
  BlendingIndices indices_;
};

// Megatron's utils.normalize: each weight divided by their sum.
std::vector<double> normalize_weights(std::vector<double> weights);

}  // namespace megaton::data
