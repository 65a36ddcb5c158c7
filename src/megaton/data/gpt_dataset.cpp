#include "megaton/data/gpt_dataset.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "megaton/core/atomic_file.h"
#include "megaton/core/error.h"
#include "megaton/data/numpy_random.h"

namespace megaton::data {

namespace fs = std::filesystem;

namespace {

// Megatron separates the last epoch when it contributes fewer than this fraction of an epoch's samples.
constexpr double kFinalEpochThreshold = 0.80;
// Bump when the cache layout or the meaning of a cached index changes, so old caches are not reused.
constexpr int kCacheFormat = 1;

uint64_t fnv1a64(const void* data, size_t n) {
  uint64_t h = 14695981039346656037ull;
  for (const auto* p = static_cast<const uint8_t*>(data); n--; ++p) h = (h ^ *p) * 1099511628211ull;
  return h;
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Megatron's _build_document_index: documents tiled epoch after epoch, then shuffled, the last epoch on
// its own when separated.
std::vector<int32_t> build_document_index(std::pair<int64_t, int64_t> docs, int64_t epochs, NumpyRandomState& rng,
                                          bool separate_final_epoch) {
  const int64_t n = docs.second - docs.first;
  std::vector<int32_t> index(static_cast<size_t>(epochs * n));
  for (int64_t e = 0; e < epochs; ++e)
    std::iota(index.begin() + e * n, index.begin() + (e + 1) * n, static_cast<int32_t>(docs.first));
  const size_t first = separate_final_epoch ? static_cast<size_t>((epochs - 1) * n) : index.size();
  rng.shuffle(std::span(index).first(first));
  rng.shuffle(std::span(index).subspan(first));
  return index;
}

// helpers.cpp build_sample_idx with drop_last_partial_sequence and add_extra_token_to_sequence: row s is
// (position in the document index, token offset) where sample s starts; sample s ends (inclusive) where
// sample s + 1 starts, so consecutive samples share one token.
std::vector<int64_t> build_sample_index(std::span<const int32_t> lengths, int64_t first_doc,
                                        std::span<const int32_t> document_index, int64_t T, int64_t num_samples) {
  std::vector<int64_t> index(static_cast<size_t>(2 * (num_samples + 1)));
  int64_t d = 0, offset = 0;
  for (int64_t s = 1; s <= num_samples; ++s) {
    int64_t remaining = T + 1;
    while (remaining != 0) {
      const int64_t length = lengths[document_index[d] - first_doc] - offset;
      remaining -= length;
      if (remaining <= 0) {
        offset += remaining + length - 1;
        remaining = 0;
      } else {
        MEGATON_CHECK(static_cast<size_t>(d) + 1 < document_index.size(), "sample ", s, " runs past the documents");
        ++d;
        offset = 0;
      }
    }
    index[2 * s] = d;
    index[2 * s + 1] = offset;
  }
  return index;
}

// Megatron's _build_shuffle_index: [0, n) shuffled, then [n, total) shuffled on its own.
std::vector<int64_t> build_shuffle_index(int64_t n, int64_t total, NumpyRandomState& rng) {
  std::vector<int64_t> index(static_cast<size_t>(total));
  std::iota(index.begin(), index.end(), 0);
  rng.shuffle(std::span(index).first(static_cast<size_t>(n)));
  if (n != total) rng.shuffle(std::span(index).subspan(static_cast<size_t>(n)));
  return index;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

GptDataset::GptDataset(std::shared_ptr<const IndexedDataset> data, Split split, std::pair<int64_t, int64_t> documents,
                       std::optional<int64_t> num_samples, const GptDatasetConfig& config)
    : data_(std::move(data)), split_(split), seq_length_(config.seq_length) {
  const std::string what = "dataset '" + data_->prefix() + "' (" + std::string(split_name(split)) + " split)";
  if (seq_length_ < 1) fail(what, ": seq_length must be positive, got ", seq_length_);
  if (config.seed < 0 || config.seed > 0xffffffffll)
    fail(what, ": seed ", config.seed, " is outside numpy's RandomState range [0, 2^32)");
  if (num_samples && *num_samples < 0) fail(what, ": negative sample count ", *num_samples);
  if (documents.first < 0 || documents.first > documents.second ||
      documents.second > static_cast<int64_t>(data_->num_sequences()))
    fail(what, ": documents [", documents.first, ", ", documents.second, ") outside the dataset's ",
         data_->num_sequences());

  std::vector<int32_t> lengths(static_cast<size_t>(documents.second - documents.first));
  for (size_t i = 0; i < lengths.size(); ++i)
    lengths[i] = static_cast<int32_t>(data_->sequence_length(static_cast<size_t>(documents.first) + i));

  nlohmann::ordered_json d;
  d["class"] = "GPTDataset";
  d["cache_format"] = kCacheFormat;
  d["index_split"] = split_name(split);
  d["documents"] = {documents.first, documents.second};
  d["sequence_lengths_fnv1a64"] = hex(fnv1a64(lengths.data(), lengths.size() * sizeof(int32_t)));
  d["num_samples"] = num_samples ? nlohmann::ordered_json(*num_samples) : nlohmann::ordered_json(nullptr);
  d["random_seed"] = config.seed;
  d["sequence_length"] = seq_length_;
  d["add_extra_token_to_sequence"] = true;
  const std::string description = d.dump(4);
  const std::string dir = config.cache_dir.empty() ? data_->prefix() + "/cache/GPTDataset_indices" : config.cache_dir;
  cache_path_ = (fs::path(dir) / (hex(fnv1a64(description.data(), description.size())) + "-GPTDataset-" +
                                  std::string(split_name(split))))
                    .string();
  if (load_cache(description)) return;

  const int64_t T = seq_length_;
  const int64_t tokens_per_epoch = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  if (tokens_per_epoch == 0 && num_samples.value_or(0) > 0)
    fail(what, ": documents [", documents.first, ", ", documents.second, ") hold no tokens, but ", *num_samples,
         " samples were requested");
  // Megatron's _get_num_epochs: enough epochs for num_samples windows of T + 1 tokens overlapping by one.
  // (An empty split asked for 0 samples has no epochs to count: it stays empty.)
  if (num_samples && tokens_per_epoch > 0)
    while (num_epochs_ * tokens_per_epoch < *num_samples * T + 1) ++num_epochs_;
  int64_t samples_before_final_epoch = 0;
  if (num_epochs_ > 1) {
    samples_before_final_epoch = ((num_epochs_ - 1) * tokens_per_epoch - 1) / T;
    const int64_t from_final_epoch = *num_samples - samples_before_final_epoch;
    const int64_t per_epoch = (tokens_per_epoch - 1) / T;
    separate_final_epoch_ = from_final_epoch < static_cast<int64_t>(kFinalEpochThreshold * per_epoch);
  }

  NumpyRandomState rng(static_cast<uint32_t>(config.seed));
  document_owned_ = build_document_index(documents, num_epochs_, rng, separate_final_epoch_);
  const int64_t total = tokens_per_epoch > 0 ? (num_epochs_ * tokens_per_epoch - 1) / T : 0;
  sample_owned_ = build_sample_index(lengths, documents.first, document_owned_, T, total);
  shuffle_owned_ = build_shuffle_index(separate_final_epoch_ ? samples_before_final_epoch : total, total, rng);
  document_index_ = document_owned_;
  sample_index_ = sample_owned_;
  shuffle_index_ = shuffle_owned_;
  built_anew_ = true;
  save_cache(description);
}

bool GptDataset::load_cache(const std::string& description) {
  const std::string desc_path = cache_path_ + "-description.txt";
  if (!fs::exists(desc_path) || read_text(desc_path) != description) return false;
  try {
    for (const char* name : {"document_index", "sample_index", "shuffle_index"})
      mapped_.emplace_back(cache_path_ + "-" + name + ".npy");
    auto doc = mapped_[0].values<int32_t>();
    auto sample = mapped_[1].values<int64_t>();
    auto shuffle = mapped_[2].values<int64_t>();
    // Checked once here so that reads can trust the indices: a damaged cache is rebuilt, not followed.
    const auto n = static_cast<int64_t>(shuffle.size());
    if (sample.size() != static_cast<size_t>(2 * (n + 1))) fail(cache_path_, ": sample and shuffle index disagree");
    // Each row starts a sample in document_index; the last row only ends the last sample, so it may
    // sit one past the end (an empty split's single row does).
    for (size_t r = 0; r < sample.size(); r += 2)
      if (sample[r] < 0 || sample[r + 1] < 0 ||
          static_cast<size_t>(sample[r]) >= doc.size() + (r + 2 == sample.size() ? 1 : 0))
        fail(cache_path_, "-sample_index.npy: row ", r / 2, " is out of range");
    for (int64_t s : shuffle)
      if (s < 0 || s >= n) fail(cache_path_, "-shuffle_index.npy: entry ", s, " is out of range");
    for (int32_t doc_id : doc)
      if (doc_id < 0 || static_cast<size_t>(doc_id) >= data_->num_sequences())
        fail(cache_path_, "-document_index.npy: document ", doc_id, " is out of range");
    document_index_ = doc;
    sample_index_ = sample;
    shuffle_index_ = shuffle;
    return true;
  } catch (const Error& e) {
    std::fprintf(stderr, "warning: rebuilding the cached sampling indices: %s\n", e.what());
    mapped_.clear();
    return false;
  }
}

void GptDataset::save_cache(const std::string& description) const {
  try {
    fs::create_directories(fs::path(cache_path_).parent_path());
    write_npy<int32_t>(cache_path_ + "-document_index.npy", document_index_, {std::ssize(document_index_)});
    write_npy<int64_t>(cache_path_ + "-sample_index.npy", sample_index_, {std::ssize(sample_index_) / 2, 2});
    write_npy<int64_t>(cache_path_ + "-shuffle_index.npy", shuffle_index_, {std::ssize(shuffle_index_)});
    // The description goes last: it marks the three arrays as complete.
    AtomicFile desc(cache_path_ + "-description.txt");
    desc.write(description.data(), description.size());
    desc.commit();
  } catch (const std::exception& e) {
    // Training can proceed without the cache; it is only rebuilt next time.
    std::fprintf(stderr, "warning: cannot cache the sampling indices at %s: %s\n", cache_path_.c_str(), e.what());
  }
}

void GptDataset::read(int64_t i, int32_t* out) const {
  if (i < 0 || i >= size()) fail("dataset '", data_->prefix(), "': sample ", i, " out of range (", size(), " samples)");
  const auto s = static_cast<size_t>(shuffle_index_[static_cast<size_t>(i)]);
  const int64_t first = sample_index_[2 * s], first_offset = sample_index_[2 * s + 1];
  const int64_t last = sample_index_[2 * s + 2], last_offset = sample_index_[2 * s + 3];
  int64_t written = 0;
  for (int64_t d = first; d <= last; ++d) {
    const auto seq = static_cast<size_t>(document_index_[static_cast<size_t>(d)]);
    const int64_t offset = d == first ? first_offset : 0;
    const int64_t n = (d == last ? last_offset + 1 : static_cast<int64_t>(data_->sequence_length(seq))) - offset;
    if (n < 0 || written + n > seq_length_ + 1) break;  // reported below; never write past out
    data_->get(seq, static_cast<size_t>(offset), static_cast<size_t>(n), out + written);
    written += n;
  }
  if (written != seq_length_ + 1)
    fail(cache_path_, ": sample ", i, " spans ", written, " tokens instead of ", seq_length_ + 1,
         " (inconsistent sampling indices; delete the cache files to rebuild them)");
}

std::array<std::shared_ptr<GptDataset>, 3> build_gpt_splits(const std::string& prefix,
                                                            const std::array<std::optional<int64_t>, 3>& num_samples,
                                                            const GptDatasetConfig& config) {
  auto data = std::make_shared<const IndexedDataset>(IndexedDataset::open(prefix));
  const SplitMatrix matrix = parse_split(config.split);
  std::array<std::shared_ptr<GptDataset>, 3> out;
  for (Split s : kSplits) {
    const auto docs = split_documents(matrix, s, static_cast<int64_t>(data->num_sequences()));
    const auto k = static_cast<size_t>(s);
    if (docs) out[k] = std::make_shared<GptDataset>(data, s, *docs, num_samples[k], config);
  }
  return out;
}

}  // namespace megaton::data
