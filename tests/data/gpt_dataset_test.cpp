#include "megaton/data/gpt_dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <random>

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
    ASSERT_TRUE(std::equal(got.begin(), got.end(), stream.begin() + start)) << "sample " << i;
  }
}

bool is_permutation_of(std::span<const int64_t> v, int64_t begin, int64_t end) {
  std::vector<int64_t> sorted(v.begin(), v.end()), want(static_cast<size_t>(end - begin));
  std::sort(sorted.begin(), sorted.end());
  std::iota(want.begin(), want.end(), begin);
  return sorted == want;
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
  // The last epoch's documents are shuffled among themselves, after the others.
  std::vector<int32_t> last(ds.document_index().end() - 30, ds.document_index().end());
  std::sort(last.begin(), last.end());
  std::vector<int32_t> docs(30);
  std::iota(docs.begin(), docs.end(), 5);
  EXPECT_EQ(last, docs);
  const int64_t before_final = (2 * tokens - 1) / T;
  EXPECT_TRUE(is_permutation_of(ds.shuffle_index().first(static_cast<size_t>(before_final)), 0, before_final));
  EXPECT_TRUE(
      is_permutation_of(ds.shuffle_index().subspan(static_cast<size_t>(before_final)), before_final, ds.size()));
  expect_windows_follow_the_indices(ds);

  // Nearly a whole last epoch: one shuffle over everything.
  GptDataset full(data, Split::kValid, {5, 35}, 2 * per_epoch - 1, config(T));
  EXPECT_EQ(full.num_epochs(), 2);
  EXPECT_FALSE(full.separate_final_epoch());
  expect_windows_follow_the_indices(full);
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
  for (int32_t doc : splits[0]->document_index()) EXPECT_LT(doc, 90);
  for (int32_t doc : splits[1]->document_index()) EXPECT_GE(doc, 90);
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
