#include "megaton/train/training_data.h"

#include <gtest/gtest.h>

#include <vector>

#include "../support/byte_dataset.h"
#include "../support/temp_dir.h"

using namespace megaton;
using megaton::testing::TempDir;

namespace {

train::TrainConfig config_for(const std::string& data_path, std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {"data.data_path=\"" + data_path + "\"", "training.seq_length=16",
                                   "training.micro_batch_size=2", "training.global_batch_size=4",
                                   "training.train_iters=30", "logging.eval_iters=3"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return train::load_train_config("", sets);
}

}  // namespace

TEST(TrainingData, BlendFeedsEveryStepAndValidationComesFromTheSplit) {
  TempDir dir;
  megaton::testing::write_byte_dataset(dir.file("a"), 120, 1);
  megaton::testing::write_byte_dataset(dir.file("b"), 120, 2);
  auto d = train::build_training_data(config_for("0.7 " + dir.file("a") + " 0.3 " + dir.file("b")));
  ASSERT_TRUE(d.train && d.valid);
  EXPECT_GE(d.train->size(), 30 * 4);
  EXPECT_GE(d.valid->size(), 3 * 2);
  std::vector<int32_t> row(17);
  d.train->read(d.train->size() - 1, row.data());  // the last sample training may draw is readable
  for (int32_t t : row) EXPECT_TRUE(t >= 0 && t <= 256);
}

TEST(TrainingData, RewindsReserveOneExtraBatchEach) {
  TempDir dir;
  megaton::testing::write_byte_dataset(dir.file("a"), 60);
  auto plain = train::build_training_data(config_for(dir.file("a"), {"data.shuffle=false"}));
  auto rewinding =
      train::build_training_data(config_for(dir.file("a"), {"data.shuffle=false", "rewind.enabled=true",
                                                            "rewind.max_rewinds=5"}));
  EXPECT_EQ(plain.train->size(), 30 * 4);
  EXPECT_EQ(rewinding.train->size(), (30 + 5) * 4);
  EXPECT_FALSE(plain.valid);
}

TEST(TrainingData, ErrorsNameTheKey) {
  TempDir dir;
  megaton::testing::write_byte_dataset(dir.file("a"), 60);
  auto msg = megaton::testing::error_message([&] {
    train::build_training_data(config_for("0.5 " + dir.file("a") + " 0.5 " + dir.file("a"), {"data.shuffle=false"}));
  });
  EXPECT_NE(msg.find("data.data_path"), std::string::npos) << msg;
  msg = megaton::testing::error_message([&] { train::build_training_data(config_for(dir.file("a"), {"data.split=\"0,100,0\""})); });
  EXPECT_NE(msg.find("data.split"), std::string::npos) << msg;
  msg = megaton::testing::error_message([&] { train::build_training_data(config_for(dir.file("missing"))); });
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}
