#include "megaton/data/gpt_dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <random>
#include <set>

#include "../support/temp_dir.h"

using namespace megaton;
using namespace megaton::data;
using megaton::testing::TempDir;

namespace {

// Token p of sequence s is s * 1000 + p, so every window tells where it came from.
int32_t token(int64_t seq, int64_t pos) { return static_cast<int32_t>(seq * 1000 + pos); }

std::shared_ptr<const IndexedDataset> write_dataset(const std::string& prefix, const std::vector<int32_t>& lengths) {
  IndexedDatasetWriter w(prefix, DType::I32);
  for (size_t s = 0; s < lengths.size(); ++s) {
    std::vector<int32_t> t(static_cast<size_t>(lengths[s]));
    for (int32_t p = 0; p < lengths[s]; ++p) t[static_cast<size_t>(p)] = token(static_cast<int64_t>(s), p);
    w.add_document(t);
  }
  w.finalize();
  return std::make_shared<const IndexedDataset>(IndexedDataset::open(prefix));
}

std::vector<int32_t> random_lengths(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> lengths(static_cast<size_t>(n));
  for (auto& l : lengths) l = static_cast<int32_t>(1 + rng() % 40);
  lengths[3] = 0;  // empty sequences occur in Megatron datasets and are stepped over
  return lengths;
}

GptDatasetConfig config(int64_t T, std::string cache_dir = {}) {
  GptDatasetConfig c;
  c.seq_length = T;
  c.seed = 1234;
  c.cache_dir = std::move(cache_dir);
  return c;
}

// Sample i must be tokens [s*T, s*T + T] of the documents concatenated in document-index order, s being
// the shuffle index's entry i: the definition build_sample_idx implements incrementally.
void expect_windows_follow_the_indices(const GptDataset& ds) {
  std::vector<int32_t> stream;
  for (int32_t seq : ds.document_index())
    for (int64_t p = 0; p < static_cast<int64_t>(ds.data().sequence_length(static_cast<size_t>(seq))); ++p)
      stream.push_back(token(seq, p));
  const int64_t T = ds.seq_length();
  std::vector<int32_t> got(static_cast<size_t>(T + 1));
  for (int64_t i = 0; i < ds.size(); ++i) {
    ds.read(i, got.data());
    const int64_t start = ds.shuffle_index()[static_cast<size_t>(i)] * T;
    ASSERT_LE(start + T + 1, std::ssize(stream)) << "sample " << i << " starts past the documents";
    ASSERT_TRUE(std::equal(got.begin(), got.end(), stream.begin() + start)) << "sample " << i;
  }
}

template <typename T>
bool is_permutation_of(std::span<const T> v, int64_t begin, int64_t end) {
  std::vector<T> sorted(v.begin(), v.end()), want(static_cast<size_t>(end - begin));
  std::sort(sorted.begin(), sorted.end());
  std::iota(want.begin(), want.end(), static_cast<T>(begin));
  return sorted == want;
}

std::set<int32_t> documents(int32_t first, int32_t last) {
  std::set<int32_t> out;
  for (int32_t d = first; d < last; ++d) out.insert(d);
  return out;
}

// Whether the last epoch of the document index holds each of documents [first, last) once, as it does
// when it is shuffled on its own (shuffled with the other epochs, it holds some twice and others not).
bool last_epoch_holds_each_document_once(const GptDataset& ds, int64_t first, int64_t last) {
  return is_permutation_of(ds.document_index().last(static_cast<size_t>(last - first)), first, last);
}

// Whether the first n reads are samples [0, n), as when the samples after the first n are shuffled apart.
bool first_reads_are_the_first_samples(const GptDataset& ds, int64_t n) {
  return is_permutation_of(ds.shuffle_index().first(static_cast<size_t>(n)), 0, n);
}

}  // namespace

TEST(GptDataset, OneEpochWindowsCrossDocumentBoundaries) {
  TempDir dir;
  const auto lengths = random_lengths(50, 1);
  auto data = write_dataset(dir.file("d"), lengths);
  const int64_t tokens = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  GptDataset ds(data, Split::kTrain, {0, 50}, std::nullopt, config(16));
  EXPECT_EQ(ds.size(), (tokens - 1) / 16);
  EXPECT_EQ(ds.num_epochs(), 1);
  EXPECT_FALSE(ds.separate_final_epoch());
  EXPECT_TRUE(is_permutation_of(ds.shuffle_index(), 0, ds.size()));
  expect_windows_follow_the_indices(ds);
}

// The exact indices Megatron builds, for a case small enough to print: megatron_indices() of
// tests/python/test_gpt_dataset_reference.py (numpy's RandomState) for these 10 documents, T = 4, seed
// 1234, and 23 samples: two epochs of 18 samples, the second shuffled apart (5 < int(0.8 * 18)).
TEST(GptDataset, MatchesMegatronsIndicesOnASmallCase) {
  TempDir dir;
  auto data = write_dataset(dir.file("d"), {7, 3, 12, 5, 9, 4, 11, 6, 8, 10});
  GptDataset ds(data, Split::kTrain, {0, 10}, 23, config(4));
  ASSERT_TRUE(ds.separate_final_epoch());
  EXPECT_TRUE(std::ranges::equal(ds.document_index(),
                                 std::vector<int32_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3, 7, 3, 5, 1, 4, 8, 0, 2, 6, 9}));
  EXPECT_TRUE(std::ranges::equal(ds.shuffle_index(),
                                 std::vector<int64_t>{4,  13, 14, 17, 8,  1,  0,  9,  7,  3,  10, 6,  2,
                                                      5,  12, 11, 16, 15, 26, 20, 32, 27, 24, 18, 22, 23,
                                                      31, 36, 25, 33, 35, 28, 34, 21, 29, 19, 30}));
  expect_windows_follow_the_indices(ds);
}

TEST(GptDataset, ShortFinalEpochIsShuffledSeparately) {
  TempDir dir;
  const auto lengths = random_lengths(40, 2);
  auto data = write_dataset(dir.file("d"), lengths);
  const int64_t tokens = std::accumulate(lengths.begin() + 5, lengths.begin() + 35, int64_t{0});
  const int64_t T = 8, per_epoch = (tokens - 1) / T;

  // Two epochs and a few samples: the third epoch gives far fewer than 80% of an epoch.
  GptDataset ds(data, Split::kValid, {5, 35}, 2 * per_epoch + 3, config(T));
  EXPECT_EQ(ds.num_epochs(), 3);
  ASSERT_TRUE(ds.separate_final_epoch());
  EXPECT_GE(ds.size(), 2 * per_epoch + 3);
  // The last epoch's documents are shuffled among themselves, after the others, and so are its samples.
  EXPECT_TRUE(last_epoch_holds_each_document_once(ds, 5, 35));
  EXPECT_TRUE(first_reads_are_the_first_samples(ds, (2 * tokens - 1) / T));
  EXPECT_TRUE(is_permutation_of(ds.shuffle_index(), 0, ds.size()));
  expect_windows_follow_the_indices(ds);

  // Nearly a whole last epoch: one shuffle over everything.
  GptDataset full(data, Split::kValid, {5, 35}, 2 * per_epoch - 1, config(T));
  EXPECT_EQ(full.num_epochs(), 2);
  EXPECT_FALSE(full.separate_final_epoch());
  expect_windows_follow_the_indices(full);
}

// Megatron's gpt_dataset.py: separate_final_epoch = num_samples_from_final_epoch < int(0.80 *
// num_samples_per_epoch). 33 documents of 801 tokens in all and T = 8 make an epoch of exactly 100
// samples, so the threshold is 80 and asking for 100 + k samples takes k from the second epoch: k = 79 is
// one below, 80 on, 81 one above the threshold. (At 100 samples an epoch a threshold of 0.79 or 0.81
// moves the cut by one sample; at 10, int(0.81 * 10) would still be 8.)
TEST(GptDataset, FinalEpochIsShuffledApartBelowEightyPercentOfAnEpoch) {
  TempDir dir;
  std::vector<int32_t> lengths(32, 25);
  lengths.push_back(1);
  auto data = write_dataset(dir.file("d"), lengths);
  const int64_t T = 8, per_epoch = 100;
  for (const auto& [from_final, apart] : {std::pair{79, true}, {80, false}, {81, false}}) {
    SCOPED_TRACE(::testing::Message() << from_final << " samples from the final epoch");
    GptDataset ds(data, Split::kTrain, {0, 33}, per_epoch + from_final, config(T));
    ASSERT_EQ(ds.num_epochs(), 2);
    ASSERT_EQ(ds.size(), 2 * per_epoch);
    EXPECT_EQ(ds.separate_final_epoch(), apart);
    // What a separate final epoch changes: it spans every document, and the first epoch's samples are all
    // read before any of its own. Shuffled together, the first 100 reads include second-epoch samples.
    EXPECT_EQ(last_epoch_holds_each_document_once(ds, 0, 33), apart);
    EXPECT_EQ(first_reads_are_the_first_samples(ds, per_epoch), apart);
    EXPECT_TRUE(is_permutation_of(ds.shuffle_index(), 0, ds.size()));
    expect_windows_follow_the_indices(ds);
  }
}

TEST(GptDataset, IndicesAreCachedAndRebuiltWhenInputsChange) {
  TempDir dir;
  const std::string prefix = dir.file("d");
  auto data = write_dataset(prefix, random_lengths(30, 3));
  GptDataset first(data, Split::kTrain, {0, 30}, 100, config(8));
  EXPECT_TRUE(first.built_anew());
  EXPECT_EQ(std::filesystem::path(first.cache_path()).parent_path(), prefix + "/cache/GPTDataset_indices");
  for (const char* suffix : {"-description.txt", "-document_index.npy", "-sample_index.npy", "-shuffle_index.npy"})
    EXPECT_TRUE(std::filesystem::exists(first.cache_path() + suffix)) << suffix;

  GptDataset again(data, Split::kTrain, {0, 30}, 100, config(8));
  EXPECT_FALSE(again.built_anew());
  EXPECT_TRUE(std::ranges::equal(again.shuffle_index(), first.shuffle_index()));
  EXPECT_TRUE(std::ranges::equal(again.sample_index(), first.sample_index()));
  EXPECT_TRUE(std::ranges::equal(again.document_index(), first.document_index()));
  expect_windows_follow_the_indices(again);

  // Another sample count, seed or sequence length is another cache entry.
  EXPECT_TRUE(GptDataset(data, Split::kTrain, {0, 30}, 101, config(8)).built_anew());
  auto seeded = config(8);
  seeded.seed = 99;
  EXPECT_TRUE(GptDataset(data, Split::kTrain, {0, 30}, 100, seeded).built_anew());

  // Rewritten data with other document lengths changes the hash; the old entry is not used.
  auto changed = write_dataset(prefix, random_lengths(30, 4));
  GptDataset rebuilt(changed, Split::kTrain, {0, 30}, 100, config(8));
  EXPECT_TRUE(rebuilt.built_anew());
  EXPECT_NE(rebuilt.cache_path(), first.cache_path());
  expect_windows_follow_the_indices(rebuilt);
}

// A split without documents asked for no samples (a blend's unused test part) caches and reloads
// its one-row sample index instead of being rebuilt, with a warning, on every run.
TEST(GptDataset, EmptySplitCacheReloads) {
  TempDir dir;
  auto data = write_dataset(dir.file("d"), random_lengths(30, 3));
  GptDataset first(data, Split::kTest, {30, 30}, 0, config(8));
  EXPECT_EQ(first.size(), 0);
  EXPECT_TRUE(first.built_anew());
  EXPECT_FALSE(GptDataset(data, Split::kTest, {30, 30}, 0, config(8)).built_anew());
}

TEST(GptDataset, DamagedCacheIsRebuilt) {
  TempDir dir;
  auto data = write_dataset(dir.file("d"), random_lengths(30, 5));
  const auto cfg = config(8, dir.file("cache"));
  GptDataset first(data, Split::kTrain, {0, 30}, 50, cfg);
  EXPECT_EQ(std::filesystem::path(first.cache_path()).parent_path(), dir.file("cache"));
  std::filesystem::resize_file(first.cache_path() + "-shuffle_index.npy", 100);
  GptDataset again(data, Split::kTrain, {0, 30}, 50, cfg);
  EXPECT_TRUE(again.built_anew());
  EXPECT_TRUE(std::ranges::equal(again.shuffle_index(), first.shuffle_index()));
}

TEST(GptDataset, SplitsFollowTheRatios) {
  TempDir dir;
  write_dataset(dir.file("d"), random_lengths(100, 6));
  auto cfg = config(8);
  cfg.split = "90,10,0";
  auto splits = build_gpt_splits(dir.file("d"), {1000, 20, 5}, cfg);
  ASSERT_TRUE(splits[0] && splits[1]);
  EXPECT_FALSE(splits[2]);
  EXPECT_GE(splits[0]->size(), 1000);
  // Each split's epochs hold exactly its documents: 90% of 100 is documents [0, 90).
  EXPECT_EQ(std::set(splits[0]->document_index().begin(), splits[0]->document_index().end()), documents(0, 90));
  EXPECT_EQ(std::set(splits[1]->document_index().begin(), splits[1]->document_index().end()), documents(90, 100));
}

TEST(GptDataset, ErrorsNameTheDatasetAndSplit) {
  TempDir dir;
  auto data = write_dataset(dir.file("d"), {0, 0, 5});
  EXPECT_ERROR_CONTAINS(GptDataset(data, Split::kValid, {0, 2}, 10, config(4)), dir.file("d"), "valid split",
                        "hold no tokens");
  EXPECT_ERROR_CONTAINS(GptDataset(data, Split::kTrain, {0, 3}, 1, config(0)), "seq_length");
  auto bad_seed = config(4);
  bad_seed.seed = int64_t{1} << 32;
  EXPECT_ERROR_CONTAINS(GptDataset(data, Split::kTrain, {0, 3}, 1, bad_seed), "seed");
  EXPECT_EQ(GptDataset(data, Split::kTest, {0, 2}, std::nullopt, config(4)).size(), 0);
}
