// Train / validation / test split of a dataset's documents by ratio, as Megatron's `--split 969,30,1`
// (blended_megatron_dataset_config.py parse_and_normalize_split + convert_split_vector_to_split_matrix,
// and the document ranges of BlendedMegatronDatasetBuilder): the ratios are normalised, turned into
// cumulative book-ends, and split i takes documents [round(begin_i * N), round(end_i * N)) with Python's
// round-half-to-even, so both tools cut the same documents.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace megaton::data {

enum class Split { kTrain = 0, kValid = 1, kTest = 2 };
inline constexpr std::array<Split, 3> kSplits{Split::kTrain, Split::kValid, Split::kTest};
std::string_view split_name(Split s);  // "train", "valid", "test" (Megatron's Split enum names)

// Fractions [begin, end) of the documents per split; nullopt for a split with ratio 0.
using SplitMatrix = std::array<std::optional<std::pair<double, double>>, 3>;

// "969,30,1", "99,1" (missing ratios are 0), "1": numbers separated by anything else, like Megatron's
// regex [.0-9]+. Errors name the string: no numbers, more than three, or all zero.
SplitMatrix parse_split(std::string_view split);

// Documents [begin, end) of a split of num_documents; nullopt when the matrix has no such split.
std::optional<std::pair<int64_t, int64_t>> split_documents(const SplitMatrix& m, Split s, int64_t num_documents);

}  // namespace megaton::data
