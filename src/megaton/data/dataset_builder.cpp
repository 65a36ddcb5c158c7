#include "megaton/data/dataset_builder.h"

#include <cmath>
#include <cstdlib>
#include <numeric>
#include <sstream>

#include "megaton/core/error.h"
#include "megaton/data/blended_dataset.h"

namespace megaton::data {

namespace {

// Megatron builds each blended dataset's share with this fraction more samples than the blend draws.
constexpr double kMidLevelSurplus = 0.005;

std::optional<double> as_number(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size()) return std::nullopt;
  return v;
}

}  // namespace

Blend parse_blend(std::string_view data_path) {
  std::istringstream in{std::string(data_path)};
  std::vector<std::string> items;
  for (std::string item; in >> item;) items.push_back(item);
  if (items.empty()) fail("data path '", data_path, "' names no dataset");

  size_t numbers_at_even = 0;
  for (size_t i = 0; i < items.size(); i += 2) numbers_at_even += as_number(items[i]).has_value();
  Blend blend;
  if (numbers_at_even == 0) {
    blend.prefixes = items;
    return blend;
  }
  if (items.size() % 2 != 0 || numbers_at_even != (items.size() + 1) / 2)
    fail("data path '", data_path, "': expected PREFIX, PREFIX PREFIX ..., or WEIGHT PREFIX WEIGHT PREFIX ... ",
         "(e.g. \"0.7 data/web 0.3 data/code\")");
  for (size_t i = 0; i < items.size(); i += 2) {
    blend.weights.push_back(*as_number(items[i]));
    blend.prefixes.push_back(items[i + 1]);
  }
  return blend;
}

std::array<std::shared_ptr<const SampleSource>, 3> build_datasets(
    const Blend& blend, const std::array<std::optional<int64_t>, 3>& num_samples, const GptDatasetConfig& config) {
  std::array<std::shared_ptr<const SampleSource>, 3> out;
  const bool weighted = !blend.weights.empty();
  if (blend.prefixes.size() == 1 && !weighted) {
    const auto splits = build_gpt_splits(blend.prefixes[0], num_samples, config);
    std::copy(splits.begin(), splits.end(), out.begin());
    return out;
  }
  if (weighted && blend.weights.size() != blend.prefixes.size())
    fail("blend: ", blend.prefixes.size(), " datasets but ", blend.weights.size(), " weights");
  const std::vector<double> weights = weighted ? normalize_weights(blend.weights) : std::vector<double>{};
  for (Split s : kSplits)
    if (!num_samples[static_cast<size_t>(s)] && parse_split(config.split)[static_cast<size_t>(s)])
      fail("blend of ", blend.prefixes.size(), " datasets: the ", split_name(s),
           " split needs a sample count (a blend is not drawn for one epoch)");

  // targets[j][i]: samples dataset j gives split i; datasets are built with the surplus on top.
  std::vector<std::array<std::optional<int64_t>, 3>> targets(blend.prefixes.size());
  std::vector<std::array<std::shared_ptr<GptDataset>, 3>> parts;
  for (size_t j = 0; j < blend.prefixes.size(); ++j) {
    std::array<std::optional<int64_t>, 3> built;
    for (size_t i = 0; i < 3 && weighted; ++i) {
      if (!num_samples[i]) continue;
      const double target = std::ceil(static_cast<double>(*num_samples[i]) * weights[j]);
      targets[j][i] = static_cast<int64_t>(target);
      built[i] = static_cast<int64_t>(std::ceil(target * (1 + kMidLevelSurplus)));
    }
    parts.push_back(build_gpt_splits(blend.prefixes[j], built, config));
  }

  for (size_t i = 0; i < 3; ++i) {
    if (!parts[0][i]) continue;
    std::vector<std::shared_ptr<const SampleSource>> sources;
    std::vector<double> split_weights;
    int64_t size = 0;
    for (size_t j = 0; j < parts.size(); ++j) {
      sources.push_back(parts[j][i]);
      // Unweighted blends mix in proportion to the datasets' sizes, up to the requested count.
      split_weights.push_back(weighted ? weights[j] : static_cast<double>(parts[j][i]->size()));
      size += weighted ? *targets[j][i] : parts[j][i]->size();
    }
    if (!weighted) size = std::min(size, *num_samples[i]);
    out[i] = std::make_shared<BlendedDataset>(std::move(sources), std::move(split_weights), size);
  }
  return out;
}

}  // namespace megaton::data
