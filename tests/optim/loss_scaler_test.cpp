// Megatron's dynamic loss scaling (optim/loss_scaler.h): skip and back off after `hysteresis`
// overflows, grow after `window` clean steps, floor at min_scale, static scaling never changes.
#include "megaton/optim/loss_scaler.h"

#include <gtest/gtest.h>

namespace megaton::optim {
namespace {

TEST(LossScaler, BacksOffAfterHysteresisAndGrowsAfterAWindow) {
  LossScaler s({.initial_scale = 1024, .min_scale = 256, .window = 3, .hysteresis = 2});
  EXPECT_TRUE(s.update(false));   // skipped, hysteresis 2 -> 1: the scale holds
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.update(false));   // second overflow: halve
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.update(false));   // hysteresis stays spent until a growth: halve again
  EXPECT_EQ(s.scale(), 256);
  EXPECT_TRUE(s.update(false));   // floored at min_scale
  EXPECT_EQ(s.scale(), 256);
  EXPECT_EQ(s.skipped_steps(), 4);
  EXPECT_FALSE(s.update(true));
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 256);
  EXPECT_FALSE(s.update(true));   // third clean step in a row: double, hysteresis restored
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.update(false));   // one overflow is absorbed again
  EXPECT_EQ(s.scale(), 512);
  EXPECT_FALSE(s.update(true));
  EXPECT_FALSE(s.update(true));
  EXPECT_TRUE(s.update(false));   // an overflow resets the growth count
  EXPECT_EQ(s.scale(), 256);
}

TEST(LossScaler, StaticScaleNeverChangesOrSkips) {
  LossScaler s({.fixed_scale = 128.0});
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 128);
  EXPECT_EQ(s.skipped_steps(), 0);
}

TEST(LossScaler, StateRoundTrips) {
  LossScalerConfig c{.initial_scale = 64, .min_scale = 1, .window = 5, .hysteresis = 3};
  LossScaler a(c), b(c);
  for (bool ok : {true, false, true, true, false}) a.update(ok);
  b.load_state(a.state());
  EXPECT_EQ(b.state(), a.state());
  for (bool ok : {false, true, true, true, true, true}) EXPECT_EQ(a.update(ok), b.update(ok));
  EXPECT_EQ(b.state(), a.state());
  EXPECT_THROW(b.load_state({1.0, 2.0}), std::exception);
  EXPECT_THROW(b.load_state({0.0, 0, 0, 0}), std::exception);
}

TEST(LossScaler, ConfigIsRangeChecked) {
  EXPECT_THROW(LossScaler({.initial_scale = 0}), std::exception);
  EXPECT_THROW(LossScaler({.initial_scale = 8, .min_scale = 16}), std::exception);
  EXPECT_THROW(LossScaler({.window = 0}), std::exception);
  EXPECT_THROW(LossScaler({.hysteresis = 0}), std::exception);
  EXPECT_THROW(LossScaler({.fixed_scale = -1.0}), std::exception);
}

}  // namespace
}  // namespace megaton::optim
