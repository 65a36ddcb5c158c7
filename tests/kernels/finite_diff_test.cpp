// fd::close is what every kernel comparison rests on: it must fail on exactly the results a
// max-fold lets through (NaN, which std::max drops) and on comparisons that mean nothing.
#include "finite_diff.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

using namespace megaton;

namespace {

std::string message(const ::testing::AssertionResult& r) { return r.message(); }

}  // namespace

TEST(FiniteDiff, CloseFailsOnNonFiniteMismatchedOrScaleless) {
  const std::vector<double> want{1.0, -2.0, 0.5};
  EXPECT_TRUE(fd::close({1.0, -2.0, 0.5 + 1e-9}, want, 1e-8));
  const auto off = fd::close({1.0, -2.0, 0.6}, want, 1e-8);
  EXPECT_FALSE(off);
  EXPECT_NE(message(off).find("at [2]"), std::string::npos) << message(off);

  for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    const auto r = fd::close({1.0, bad, 0.5}, want, 1e-8);
    EXPECT_FALSE(r) << bad;
    EXPECT_NE(message(r).find("got[1]"), std::string::npos) << message(r);
    EXPECT_NE(message(r).find("not finite"), std::string::npos) << message(r);
    EXPECT_FALSE(fd::close(want, {1.0, bad, 0.5}, 1e-8)) << "non-finite reference " << bad;
  }
  EXPECT_FALSE(fd::close({1.0, -2.0}, want, 1e-8));
  EXPECT_FALSE(fd::close({0.0, 0.0}, {0.0, 0.0}, 1e-8));
}
