#include "megaton/data/blended_dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "../support/byte_dataset.h"
#include "../support/counting_source.h"
#include "../support/temp_dir.h"
#include "megaton/data/data_loader.h"
#include "megaton/data/dataset_builder.h"

using namespace megaton;
using namespace megaton::data;
using megaton::testing::CountingSource;
using megaton::testing::TempDir;

namespace {

// Every token of source (or dataset) d is d * kTag plus less than kTag, so any sample read through a blend
// tells which source it came from.
constexpr int32_t kTag = 1'000'000;

int32_t origin(int32_t token) { return token / kTag; }

// Megatron's helpers.cpp build_blending_indices, restated: sample i comes from the source furthest behind
// its share, weight * max(i, 1) - samples taken so far (the first sample is scored as if one had been
// drawn), the first of equals. weights must sum to 1. The product is rounded before the subtraction, as in
// Megatron's build (-std=c++11: no fused multiply-subtract); volatile keeps -march=native from fusing them.
std::vector<int16_t> greedy_origins(const std::vector<double>& weights, int64_t size) {
  std::vector<int16_t> out;
  std::vector<int64_t> taken(weights.size(), 0);
  std::vector<double> behind(weights.size());
  for (int64_t i = 0; i < size; ++i) {
    for (size_t d = 0; d < weights.size(); ++d) {
      const volatile double share = weights[d] * static_cast<double>(std::max<int64_t>(i, 1));
      behind[d] = share - static_cast<double>(taken[d]);
    }
    const auto d = std::max_element(behind.begin(), behind.end()) - behind.begin();  // the first of equals
    out.push_back(static_cast<int16_t>(d));
    ++taken[static_cast<size_t>(d)];
  }
  return out;
}

std::vector<double> divided_by_sum(std::vector<double> w) {
  double sum = 0;
  for (double x : w) sum += x;
  for (double& x : w) x /= sum;
  return w;
}

// CountingSource's samples (sample i is i * 1000 + t) tagged with the source's index in the blend.
class TaggedSource final : public SampleSource {
 public:
  TaggedSource(int32_t tag, int64_t size, int64_t T) : tag_(tag), counting_(size, T) {}
  int64_t size() const override { return counting_.size(); }
  int64_t seq_length() const override { return counting_.seq_length(); }
  void read(int64_t i, int32_t* out) const override {
    counting_.read(i, out);
    for (int64_t t = 0; t <= seq_length(); ++t) out[t] += tag_ * kTag;
  }

 private:
  int32_t tag_;
  CountingSource counting_;
};

// A Megatron dataset on disk whose token p of document s is tag * kTag + s * 100 + p (documents of 5 to 44
// tokens).
void write_tagged_dataset(const std::string& prefix, int32_t tag, int docs) {
  IndexedDatasetWriter w(prefix, DType::I32);
  std::mt19937 rng(static_cast<uint32_t>(tag));
  for (int32_t s = 0; s < docs; ++s) {
    std::vector<int32_t> tokens(5 + rng() % 40);
    for (size_t p = 0; p < tokens.size(); ++p) tokens[p] = tag * kTag + s * 100 + static_cast<int32_t>(p);
    w.add_document(tokens);
  }
  w.finalize();
}

const std::vector<std::vector<double>> kBlends{
    {0.7, 0.3}, {0.5, 0.3, 0.2}, {0.123, 0.877}, {1, 1, 1, 1, 1, 1, 1}, {0.01, 0.99}, {0.6, 0.25, 0.1, 0.05}, {3, 0, 1}};

}  // namespace

TEST(BlendedDataset, EveryPrefixHoldsEachSourceWithinOneSampleOfItsWeight) {
  for (const auto& raw : kBlends) {
    const auto w = normalize_weights(raw);
    const auto idx = build_blending_indices(w, 10000);
    std::vector<int64_t> count(w.size(), 0);
    for (size_t n = 1; n <= idx.dataset_index.size(); ++n) {
      const auto d = static_cast<size_t>(idx.dataset_index[n - 1]);
      // Each source's samples are taken in order 0, 1, 2, ...
      ASSERT_EQ(idx.dataset_sample_index[n - 1], count[d]) << "sample " << n - 1;
      ++count[d];
      for (size_t j = 0; j < w.size(); ++j)
        ASSERT_LE(std::abs(static_cast<double>(count[j]) - w[j] * static_cast<double>(n)), 1.0)
            << "source " << j << " after " << n << " samples, weights " << ::testing::PrintToString(raw);
    }
  }
}

TEST(BlendedDataset, MatchesMegatronsGreedyOrder) {
  // Megatron's helpers.cpp build_blending_indices([0.7, 0.3], 10), its loop transcribed to Python: the
  // first pick is scored as if one sample were drawn (scoring it as sample i + 1 gives source 0 at i = 4).
  EXPECT_EQ(build_blending_indices(std::vector<double>{0.7, 0.3}, 10).dataset_index,
            (std::vector<int16_t>{0, 1, 0, 0, 1, 0, 0, 1, 0, 0}));
  // Worked by hand; these weights are exact in binary, so sources 1 and 2 tie exactly at samples 1 and 5,
  // and all three at sample 4: ties go to the lowest index.
  EXPECT_EQ(build_blending_indices(std::vector<double>{0.5, 0.25, 0.25}, 8).dataset_index,
            (std::vector<int16_t>{0, 1, 2, 0, 0, 1, 2, 0}));
  // The same loop in Python: at sample 10 the rounded products make all three sources exactly even
  // (0.5 * 10 - 5 == 0.3 * 10 - 3 == 0.2 * 10 - 2 == 0), so source 0 is picked; unrounded (a fused
  // multiply-subtract) 0.2 * 10 - 2 is above 0 and source 2 would be.
  EXPECT_EQ(build_blending_indices(std::vector<double>{0.5, 0.3, 0.2}, 12).dataset_index,
            (std::vector<int16_t>{0, 1, 2, 0, 1, 0, 2, 0, 1, 0, 0, 1}));
  for (const auto& raw : kBlends) {
    const auto w = divided_by_sum(raw);
    EXPECT_EQ(build_blending_indices(w, 10000).dataset_index, greedy_origins(w, 10000))
        << "weights " << ::testing::PrintToString(raw);
  }
}

// Sources that tag their tokens show which source, and which of its samples, each read returned.
TEST(BlendedDataset, ReadsTheNextSampleOfTheChosenSource) {
  const int64_t T = 4, size = 40;
  BlendedDataset blend({std::make_shared<TaggedSource>(0, 100, T), std::make_shared<TaggedSource>(1, 100, T)},
                       {1, 3}, size);
  EXPECT_EQ(blend.size(), size);
  EXPECT_EQ(blend.weights(), (std::vector<double>{0.25, 0.75}));
  const auto want = greedy_origins({0.25, 0.75}, size);
  std::vector<int64_t> taken(2, 0);
  std::vector<int32_t> got(T + 1);
  for (int64_t i = 0; i < size; ++i) {
    blend.read(i, got.data());
    const auto d = static_cast<size_t>(want[static_cast<size_t>(i)]);
    ASSERT_EQ(origin(got[0]), static_cast<int32_t>(d)) << "sample " << i;
    for (int64_t t = 0; t <= T; ++t)
      ASSERT_EQ(got[static_cast<size_t>(t)], static_cast<int32_t>(d) * kTag + taken[d] * 1000 + t)
          << "sample " << i << " token " << t;
    ++taken[d];
  }
}

TEST(BlendedDataset, ErrorsNameTheProblem) {
  auto small = std::make_shared<CountingSource>(5, 4), big = std::make_shared<CountingSource>(100, 4);
  EXPECT_ERROR_CONTAINS(BlendedDataset({small, big}, {0.5, 0.5}, 40), "dataset 0", "5 samples", "draws 20");
  EXPECT_ERROR_CONTAINS(BlendedDataset({big, std::make_shared<CountingSource>(100, 8)}, {1, 1}, 4), "seq_length");
  EXPECT_ERROR_CONTAINS(BlendedDataset({big}, {1, 1}, 4), "1 datasets but 2 weights");
  EXPECT_ERROR_CONTAINS(normalize_weights({1, -1}), "weight -1");
  EXPECT_ERROR_CONTAINS(normalize_weights({0, 0}), "sum to zero");
}

TEST(DatasetBuilder, ParsesMegatronDataPaths) {
  const Blend weighted = parse_blend(" 0.7 data/web  0.3 data/code ");
  EXPECT_EQ(weighted.prefixes, (std::vector<std::string>{"data/web", "data/code"}));
  EXPECT_EQ(weighted.weights, (std::vector<double>{0.7, 0.3}));
  const Blend plain = parse_blend("data/a data/b");
  EXPECT_EQ(plain.prefixes, (std::vector<std::string>{"data/a", "data/b"}));
  EXPECT_TRUE(plain.weights.empty());
  EXPECT_EQ(parse_blend("data/a").prefixes, std::vector<std::string>{"data/a"});
  EXPECT_ERROR_CONTAINS(parse_blend("0.7 a b"), "'0.7 a b'", "WEIGHT PREFIX");
  EXPECT_ERROR_CONTAINS(parse_blend("0.7 a 0.3"), "'0.7 a 0.3'");
  EXPECT_ERROR_CONTAINS(parse_blend("  "), "names no dataset");
}

TEST(DatasetBuilder, WeightedBlendDrawsCeilOfEachShare) {
  TempDir dir;
  megaton::testing::write_byte_dataset(dir.file("a"), 300, 1);
  megaton::testing::write_byte_dataset(dir.file("b"), 200, 2);
  GptDatasetConfig cfg;
  cfg.seq_length = 32;
  cfg.split = "90,10";
  auto splits = build_datasets(parse_blend("0.7 " + dir.file("a") + " 0.3 " + dir.file("b")), {1001, 50, 7}, cfg);
  ASSERT_TRUE(splits[0] && splits[1]);
  EXPECT_FALSE(splits[2]);
  EXPECT_EQ(splits[0]->size(), 701 + 301);  // ceil(1001 * 0.7) + ceil(1001 * 0.3)
  EXPECT_EQ(splits[1]->size(), 35 + 15);

  // Without weights the blend stops at the requested count (BlendOfDatasetsOnDiskReadsEachSampleFromItsDataset
  // checks how it mixes).
  auto plain = build_datasets(parse_blend(dir.file("a") + " " + dir.file("b")), {100, 5, 1}, cfg);
  EXPECT_EQ(plain[0]->size(), 100);
  EXPECT_ERROR_CONTAINS(build_datasets(parse_blend(dir.file("a") + " " + dir.file("b")), {100, std::nullopt, 1}, cfg),
                        "valid split needs a sample count");
}

namespace {

// Reads all of `blend` through a DataLoader and checks every sample: it must be the next unused sample of
// the dataset the greedy rule over `weights` picks for it, parts[d] being dataset d's own samples; and
// each dataset must have given within one sample of its share.
void expect_reads_follow_the_greedy_rule(std::shared_ptr<const SampleSource> blend, const std::vector<double>& weights,
                                         const std::vector<std::shared_ptr<const SampleSource>>& parts) {
  const auto want = greedy_origins(weights, blend->size());
  const int64_t B = 3, T = blend->seq_length();
  DataLoaderOptions options;
  options.micro_batch_size = B;
  DataLoader loader(blend, options);
  std::vector<int64_t> taken(parts.size(), 0);
  std::vector<int32_t> expected(static_cast<size_t>(T + 1));
  int64_t seen = 0;
  for (Batch batch; loader.next(batch);) {
    for (int64_t r = 0; r < B; ++r, ++seen) {
      const int64_t i = batch.sample_ids[static_cast<size_t>(r)];
      ASSERT_EQ(i, seen);
      // The sample's T + 1 tokens: its inputs row and the last of its targets.
      std::vector<int32_t> got(batch.inputs.begin() + r * T, batch.inputs.begin() + (r + 1) * T);
      got.push_back(batch.targets[static_cast<size_t>((r + 1) * T - 1)]);
      const auto d = static_cast<size_t>(want[static_cast<size_t>(i)]);
      ASSERT_EQ(origin(got[0]), static_cast<int32_t>(d)) << "sample " << i << " came from another dataset";
      parts[d]->read(taken[d], expected.data());
      ASSERT_EQ(got, expected) << "sample " << i << " is not sample " << taken[d] << " of dataset " << d;
      ++taken[d];
    }
  }
  ASSERT_EQ(seen, blend->size()) << "the tests pick sizes that B divides";
  for (size_t d = 0; d < parts.size(); ++d)
    EXPECT_LE(std::abs(static_cast<double>(taken[d]) - weights[d] * static_cast<double>(seen)), 1.0)
        << "dataset " << d << " gave " << taken[d] << " of " << seen << " samples";
}

}  // namespace

// End to end: two datasets on disk, each split and sampled by GptDataset, blended by the builder and
// read by the DataLoader. With weights they mix by weight, without by the datasets' sizes.
TEST(DatasetBuilder, BlendOfDatasetsOnDiskReadsEachSampleFromItsDataset) {
  TempDir dir;
  const std::string a = dir.file("a"), b = dir.file("b");
  write_tagged_dataset(a, 0, 80);
  write_tagged_dataset(b, 1, 60);
  GptDatasetConfig cfg;
  cfg.seq_length = 8;
  cfg.split = "1";  // train only
  // Each dataset's samples, one epoch. A blend asking a dataset for no more than one epoch gets these
  // same samples: one epoch's indices do not depend on the sample count.
  const std::vector<std::shared_ptr<const SampleSource>> parts{build_gpt_splits(a, {}, cfg)[0],
                                                               build_gpt_splits(b, {}, cfg)[0]};
  ASSERT_GE(parts[0]->size(), 135);  // ceil(134 * 1.005), what the weighted blend builds of a
  ASSERT_GE(parts[1]->size(), 68);

  const auto weighted = build_datasets(parse_blend("2 " + a + " 1 " + b), {200, std::nullopt, std::nullopt}, cfg)[0];
  ASSERT_EQ(weighted->size(), 134 + 67);  // ceil(200 * 2/3) + ceil(200 * 1/3)
  expect_reads_follow_the_greedy_rule(weighted, divided_by_sum({2, 1}), parts);

  const auto plain = build_datasets(parse_blend(a + " " + b), {99, std::nullopt, std::nullopt}, cfg)[0];
  ASSERT_EQ(plain->size(), 99);
  const auto by_size = divided_by_sum({static_cast<double>(parts[0]->size()), static_cast<double>(parts[1]->size())});
  expect_reads_follow_the_greedy_rule(plain, by_size, parts);
}
