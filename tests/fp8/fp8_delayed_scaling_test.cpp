// TransformerEngine's delayed scaling (fp8/delayed_scaling.h).
#include "megaton/fp8/delayed_scaling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>


namespace megaton::fp8 {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(Fp8DelayedScaling, ScaleFromTheHistoryThenRoll) {
  DelayedScaling s(Format::E4M3, {.margin = 0, .history_len = 3, .algo = AmaxAlgo::Max});
  EXPECT_FALSE(s.scale());  // none before an amax has been seen (the linear calibrates)
  s.record(2.0f);
  s.record(4.0f);  // several quantisations in a step: the step's max
  s.update();
  EXPECT_EQ(s.scale(), 112.0f);  // 448 / 4
  EXPECT_EQ(s.newest_amax(), 0.0f);
  s.record(1.0f);
  s.update();
  EXPECT_EQ(s.scale(), 112.0f);  // max over the history still sees 4
  s.record(1.0f);
  s.update();
  EXPECT_EQ(s.scale(), 112.0f);
  s.record(1.0f);
  s.update();
  EXPECT_EQ(s.scale(), 448.0f);  // the 4 has rolled out of a 3-slot history
}

TEST(Fp8DelayedScaling, MostRecentAndMargin) {
  DelayedScaling s(Format::E5M2, {.margin = 2, .history_len = 4, .algo = AmaxAlgo::MostRecent});
  s.record(1024.0f);
  s.update();
  EXPECT_EQ(s.scale(), 14.0f);  // 57344 / 1024 / 4
  s.record(8.0f);
  s.update();
  EXPECT_EQ(s.scale(), 1792.0f);  // 57344 / 8 / 4: only the newest slot counts
}

TEST(Fp8DelayedScaling, KeepsThePreviousScaleOnZeroInfOrNaN) {
  DelayedScaling s(Format::E4M3, {});
  s.record(7.0f);
  s.update();
  EXPECT_EQ(s.scale(), 64.0f);
  for (float bad : {0.0f, kInf, kNaN}) {
    s.record(bad);
    s.update();
    EXPECT_EQ(s.scale(), 64.0f) << bad;
  }
  s.record(1.0f);
  s.record(kNaN);  // a NaN recorded in the step is not hidden by a later finite record
  s.record(2.0f);
  EXPECT_TRUE(std::isnan(s.newest_amax()));
  s.set_newest_amax(14.0f);  // what the group's max-reduction writes back
  s.update();
  EXPECT_EQ(s.scale(), 32.0f);
}

// Before a valid amax there is no scale, however many steps pass (a linear that has seen only
// zeros keeps calibrating); a checkpoint taken then says so and loads as such.
TEST(Fp8DelayedScaling, NoScaleUntilAValidAmax) {
  const DelayedScalingConfig c{.margin = 0, .history_len = 2, .algo = AmaxAlgo::MostRecent};
  DelayedScaling s(Format::E5M2, c);
  for (float bad : {0.0f, kInf, kNaN}) {
    s.record(bad);
    s.update();
    EXPECT_FALSE(s.scale()) << bad;
  }
  DelayedScaling restored(Format::E5M2, c);
  restored.load_state(s.state());
  EXPECT_FALSE(restored.scale());
  s.record(57344.0f / 8);
  s.update();
  EXPECT_EQ(s.scale(), 8.0f);
  restored.load_state(s.state());
  EXPECT_EQ(restored.scale(), 8.0f);
  std::vector<float> negative = s.state();
  negative[0] = -1.0f;
  EXPECT_THROW(restored.load_state(negative), std::exception);
}

TEST(Fp8DelayedScaling, StateRoundTripsBitwise) {
  DelayedScalingConfig c{.margin = 1, .history_len = 3, .algo = AmaxAlgo::Max};
  DelayedScaling a(Format::E4M3, c), b(Format::E4M3, c);
  for (float amax : {3.0f, 5.0f, 0.5f, 9.0f}) {
    a.record(amax);
    a.update();
  }
  a.record(6.0f);
  b.load_state(a.state());
  EXPECT_EQ(b.state(), a.state());
  a.update();
  b.update();
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.state(), a.state());
  DelayedScaling shorter(Format::E4M3, {.margin = 1, .history_len = 2, .algo = AmaxAlgo::Max});
  EXPECT_THROW(shorter.load_state(a.state()), std::exception);
}

TEST(Fp8DelayedScaling, ConfigIsRangeChecked) {
  EXPECT_THROW(DelayedScaling(Format::E4M3, {.margin = -1}), std::exception);
  EXPECT_THROW(DelayedScaling(Format::E4M3, {.history_len = 0}), std::exception);
  EXPECT_THROW(amax_algo_from_name("mean"), std::exception);
}

}  // namespace
}  // namespace megaton::fp8
