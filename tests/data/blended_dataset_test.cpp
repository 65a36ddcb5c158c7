#include "megaton/data/blended_dataset.h"

#include <gtest/gtest.h>

#include <cmath>

#include "../support/byte_dataset.h"
#include "../support/counting_source.h"
#include "../support/temp_dir.h"
#include "megaton/data/dataset_builder.h"

using namespace megaton;
using namespace megaton::data;
using megaton::testing::CountingSource;
using megaton::testing::TempDir;

TEST(BlendedDataset, EveryPrefixHoldsEachSourceWithinOneSampleOfItsWeight) {
  const std::vector<std::vector<double>> blends{
      {0.7, 0.3},   {0.5, 0.3, 0.2},        {0.123, 0.877}, {1, 1, 1, 1, 1, 1, 1},
      {0.01, 0.99}, {0.6, 0.25, 0.1, 0.05}, {3, 0, 1}};
  for (const auto& raw : blends) {
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
  // first pick is scored as if one sample were drawn, ties go to the lower index.
  const auto idx = build_blending_indices(std::vector<double>{0.7, 0.3}, 10);
  EXPECT_EQ(idx.dataset_index, (std::vector<int16_t>{0, 1, 0, 0, 1, 0, 0, 1, 0, 0}));
}

TEST(BlendedDataset, ReadsTheChosenSourcesSample) {
  auto a = std::make_shared<CountingSource>(100, 4), b = std::make_shared<CountingSource>(100, 4);
  BlendedDataset blend({a, b}, {1, 3}, 40);
  EXPECT_EQ(blend.size(), 40);
  EXPECT_EQ(blend.weights(), (std::vector<double>{0.25, 0.75}));
  std::vector<int32_t> got(5);
  for (int64_t i = 0; i < 40; ++i) {
    blend.read(i, got.data());
    EXPECT_EQ(got[0], blend.indices().dataset_sample_index[static_cast<size_t>(i)] * 1000);
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
  std::vector<int32_t> tokens(33);
  for (int64_t i = 0; i < splits[0]->size(); i += 97) splits[0]->read(i, tokens.data());

  // Without weights, datasets mix by size, up to the requested count.
  auto plain = build_datasets(parse_blend(dir.file("a") + " " + dir.file("b")), {100, 5, 1}, cfg);
  EXPECT_EQ(plain[0]->size(), 100);
  EXPECT_ERROR_CONTAINS(build_datasets(parse_blend(dir.file("a") + " " + dir.file("b")), {100, std::nullopt, 1}, cfg),
                        "valid split needs a sample count");
}
