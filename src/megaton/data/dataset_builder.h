// Training data from a Megatron-style data path, as BlendedMegatronDatasetBuilder builds it from
// `--data-path` and `--split`: one dataset prefix, or several with weights ("0.7 web 0.3 code"), each
// split into train / valid / test by document ratios and sampled with GptDataset, blended per split with
// BlendedDataset.
#pragma once
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megaton/data/gpt_dataset.h"
#include "megaton/data/sample_source.h"

namespace megaton::data {

struct Blend {
  std::vector<std::string> prefixes;
  std::vector<double> weights;  // empty: weighted by the datasets' sizes
};

// Megatron's get_blend_from_list on a whitespace-separated string: "PREFIX", "P1 P2 ..." (no weights) or
// "W1 P1 W2 P2 ..." (every other item a number). Errors name the string.
Blend parse_blend(std::string_view data_path);

// The train, valid and test sources (nullptr for a split with ratio 0). num_samples per split: how many
// samples training will draw; nullopt: one epoch of each dataset, allowed only without weights and with a
// single dataset. With weights, dataset j contributes ceil(n * w_j) samples to a split of n and is built
// with 0.5% more, as Megatron does (mid_level_dataset_surplus), so the blend never runs a dataset dry.
std::array<std::shared_ptr<const SampleSource>, 3> build_datasets(
    const Blend& blend, const std::array<std::optional<int64_t>, 3>& num_samples, const GptDatasetConfig& config);

}  // namespace megaton::data
