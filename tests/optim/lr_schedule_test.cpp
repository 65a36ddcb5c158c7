#include "megaton/optim/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>

#include "megaton/core/error.h"

using namespace megaton;
using megaton::optim::lr_decay_style_from_name;
using megaton::optim::LRDecayStyle;
using megaton::optim::LRSchedule;

namespace {
LRSchedule make(LRDecayStyle style) {
  return LRSchedule{.max_lr = 1.0, .min_lr = 0.1, .warmup_steps = 10, .decay_steps = 110, .style = style};
}
}  // namespace

TEST(LRSchedule, WarmupIsLinearFromZeroForAllStyles) {
  for (auto style : {LRDecayStyle::Constant, LRDecayStyle::Linear, LRDecayStyle::Cosine}) {
    const LRSchedule s = make(style);
    EXPECT_EQ(s.lr_at(0), 0.0);
    EXPECT_DOUBLE_EQ(s.lr_at(1), 0.1);
    EXPECT_DOUBLE_EQ(s.lr_at(5), 0.5);
    EXPECT_DOUBLE_EQ(s.lr_at(10), 1.0);  // warmup end: exactly max_lr
  }
}

TEST(LRSchedule, ConstantHoldsMaxLrForever) {
  const LRSchedule s = make(LRDecayStyle::Constant);
  EXPECT_EQ(s.lr_at(11), 1.0);
  EXPECT_EQ(s.lr_at(110), 1.0);
  EXPECT_EQ(s.lr_at(1000000), 1.0);  // Megatron ignores min_lr for "constant"
}

TEST(LRSchedule, LinearDecaysToMinLr) {
  const LRSchedule s = make(LRDecayStyle::Linear);
  EXPECT_DOUBLE_EQ(s.lr_at(35), 0.1 + 0.9 * 0.75);
  EXPECT_DOUBLE_EQ(s.lr_at(60), 0.55);
  EXPECT_DOUBLE_EQ(s.lr_at(110), 0.1);  // decay end
  EXPECT_EQ(s.lr_at(111), 0.1);
  EXPECT_EQ(s.lr_at(100000), 0.1);
}

TEST(LRSchedule, CosineDecaysToMinLr) {
  const LRSchedule s = make(LRDecayStyle::Cosine);
  EXPECT_DOUBLE_EQ(s.lr_at(11), 0.1 + 0.9 * 0.5 * (std::cos(std::numbers::pi * 0.01) + 1.0));
  EXPECT_DOUBLE_EQ(s.lr_at(35), 0.1 + 0.9 * 0.5 * (std::sqrt(0.5) + 1.0));
  EXPECT_DOUBLE_EQ(s.lr_at(60), 0.55);
  EXPECT_NEAR(s.lr_at(110), 0.1, 1e-15);  // decay end
  EXPECT_EQ(s.lr_at(111), 0.1);
  EXPECT_EQ(s.lr_at(100000), 0.1);
}

TEST(LRSchedule, NoWarmupStartsAtMaxLr) {
  LRSchedule s = make(LRDecayStyle::Cosine);
  s.warmup_steps = 0;
  EXPECT_EQ(s.lr_at(0), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(55), 0.55);
  s.style = LRDecayStyle::Linear;
  EXPECT_EQ(s.lr_at(0), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(110), 0.1);
}

TEST(LRSchedule, RejectsInvalidSettings) {
  LRSchedule s = make(LRDecayStyle::Cosine);
  EXPECT_THROW(s.lr_at(-1), Error);
  s.decay_steps = 10;  // decay must extend past warmup
  EXPECT_THROW(s.lr_at(0), Error);
  s.style = LRDecayStyle::Constant;  // ...unless nothing decays
  EXPECT_EQ(s.lr_at(20), 1.0);
  s = make(LRDecayStyle::Linear);
  s.min_lr = 2.0;
  EXPECT_THROW(s.lr_at(0), Error);
}

TEST(LRSchedule, ParsesMegatronStyleNames) {
  EXPECT_EQ(lr_decay_style_from_name("constant"), LRDecayStyle::Constant);
  EXPECT_EQ(lr_decay_style_from_name("linear"), LRDecayStyle::Linear);
  EXPECT_EQ(lr_decay_style_from_name("cosine"), LRDecayStyle::Cosine);
  try {
    lr_decay_style_from_name("WSD");
    FAIL() << "WSD accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'WSD'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("constant, linear, cosine"), std::string::npos) << msg;
  }
}
