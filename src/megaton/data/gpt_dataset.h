// Megatron-LM's GPTDataset (megatron/core/datasets/gpt_dataset.py with helpers.cpp build_sample_idx),
// index for index: a run sampled here sees the same token windows, in the same order, as Megatron with the
// same data, seed, sequence length, split and sample count.
//
// Three indices over the split's documents (Megatron's "documents" are the indexed dataset's sequences,
// which `megaton preprocess` writes one per document):
//   document index: the documents repeated for as many epochs as the requested samples need, shuffled
//     with numpy.random.RandomState(seed). When the last epoch contributes fewer than 80% of an epoch's
//     samples it is shuffled separately (appended after the others), so its few samples still span the
//     whole corpus rather than the head of one big shuffle;
//   sample index: where each (seq_length + 1)-token window starts, as (document index position, offset);
//     consecutive windows share one token and cross document boundaries;
//   shuffle index: a permutation of the samples (the last epoch's again shuffled on its own).
// They are cached as .npy files named by a hash of everything they depend on (the sequence lengths of the
// split, the seed, the sequence length, the split and the sample count), so a changed dataset or setting
// rebuilds them and an unchanged one loads them.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "megaton/data/indexed_dataset.h"
#include "megaton/data/npy_file.h"
#include "megaton/data/sample_source.h"
#include "megaton/data/split.h"

namespace megaton::data {

struct GptDatasetConfig {
  int64_t seq_length = 0;          // T: samples are T + 1 tokens
  int64_t seed = 1234;             // numpy RandomState seed: [0, 2^32)
  std::string split = "969,30,1";  // train,valid,test document ratios
  // Where the indices are cached; empty: PREFIX/cache/GPTDataset_indices, Megatron's default.
  std::string cache_dir;
};

class GptDataset final : public SampleSource {
 public:
  // Samples of documents [documents.first, documents.second) of data. num_samples: how many the caller
  // will draw (the dataset then covers enough epochs for them); nullopt: one epoch.
  GptDataset(std::shared_ptr<const IndexedDataset> data, Split split, std::pair<int64_t, int64_t> documents,
             std::optional<int64_t> num_samples, const GptDatasetConfig& config);

  int64_t size() const override { return static_cast<int64_t>(shuffle_index_.size()); }
  int64_t seq_length() const override { return seq_length_; }
  void read(int64_t i, int32_t* out) const override;

  std::span<const int32_t> document_index() const { return document_index_; }
  std::span<const int64_t> sample_index() const { return sample_index_; }  // [size() + 1][2], row-major
  std::span<const int64_t> shuffle_index() const { return shuffle_index_; }
  int64_t num_epochs() const { return num_epochs_; }
  bool separate_final_epoch() const { return separate_final_epoch_; }
  // Cache files are "<cache_path()>-<name>.npy" and "<cache_path()>-description.txt".
  const std::string& cache_path() const { return cache_path_; }
  bool built_anew() const { return built_anew_; }  // false: loaded from the cache
  const IndexedDataset& data() const { return *data_; }
  Split split() const { return split_; }

 private:
  void build(std::pair<int64_t, int64_t> documents, std::optional<int64_t> num_samples, uint32_t seed);
  bool load_cache(const std::string& description);
  void save_cache(const std::string& description) const;

  std::shared_ptr<const IndexedDataset> data_;
  Split split_;
  int64_t seq_length_;
  int64_t num_epochs_ = 1;
  bool separate_final_epoch_ = false;
  std::string cache_path_;
  bool built_anew_ = false;
  // Built here or mapped from the cache; the spans view whichever holds them.
  std::vector<int32_t> document_owned_;
  std::vector<int64_t> sample_owned_, shuffle_owned_;
  std::vector<NpyArray> mapped_;
  std::span<const int32_t> document_index_;
  std::span<const int64_t> sample_index_, shuffle_index_;
};

// The train, valid and test GptDatasets of one indexed dataset (nullptr for splits with ratio 0), as
// Megatron's BlendedMegatronDatasetBuilder builds them for a single data path. num_samples per split as
// for GptDataset.
std::array<std::shared_ptr<GptDataset>, 3> build_gpt_splits(const std::string& prefix,
                                                            const std::array<std::optional<int64_t>, 3>& num_samples,
                                                            const GptDatasetConfig& config);

}  // namespace megaton::data
