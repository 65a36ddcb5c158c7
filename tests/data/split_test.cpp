#include "megaton/data/split.h"

#include <gtest/gtest.h>

#include "../support/temp_dir.h"

using namespace megaton::data;
using Range = std::optional<std::pair<int64_t, int64_t>>;

TEST(Split, MegatronRatiosCutDocumentRanges) {
  const SplitMatrix m = parse_split("969,30,1");
  EXPECT_EQ(split_documents(m, Split::kTrain, 1000), Range({0, 969}));
  EXPECT_EQ(split_documents(m, Split::kValid, 1000), Range({969, 999}));
  EXPECT_EQ(split_documents(m, Split::kTest, 1000), Range({999, 1000}));
  EXPECT_EQ(split_name(Split::kValid), "valid");
}

TEST(Split, MissingOrZeroRatiosHaveNoSplit) {
  const SplitMatrix m = parse_split("99,1");
  EXPECT_TRUE(m[0] && m[1]);
  EXPECT_FALSE(m[2]);
  EXPECT_EQ(split_documents(m, Split::kTest, 100), Range());
  EXPECT_FALSE(parse_split("1 0 1")[1]);
  EXPECT_EQ(split_documents(parse_split("1"), Split::kTrain, 7), Range({0, 7}));
}

TEST(Split, HalvesRoundToEvenLikePython) {
  // round(1.5) == 2 and round(2.5) == 2 in Python.
  EXPECT_EQ(split_documents(parse_split("1,1"), Split::kTrain, 3), Range({0, 2}));
  EXPECT_EQ(split_documents(parse_split("1,1"), Split::kTrain, 5), Range({0, 2}));
  EXPECT_EQ(split_documents(parse_split("1,1"), Split::kValid, 5), Range({2, 5}));
}

TEST(Split, BadStringsNameThemselves) {
  EXPECT_ERROR_CONTAINS(parse_split(""), "split ''", "969,30,1");
  EXPECT_ERROR_CONTAINS(parse_split("1,2,3,4"), "'1,2,3,4'", "got 4");
  EXPECT_ERROR_CONTAINS(parse_split("0,0"), "'0,0'", "zero");
  EXPECT_ERROR_CONTAINS(parse_split("1.2.3,1"), "'1.2.3' is not a number");
}
