// Schedule generators and their validation.
#include "megaton/pipeline/schedule.h"

#include <gtest/gtest.h>

#include "megaton/core/error.h"

using namespace megaton;
using namespace megaton::pipeline;

namespace {
std::string error_of(const Schedule& s) {
  try {
    validate(s);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Schedule, NoPipeliningRunsFBWPerMicrobatchOrDefersEveryW) {
  const Schedule eager = no_pipelining(3);
  EXPECT_EQ(describe(eager), "stage 0: F0 B0 W0 F1 B1 W1 F2 B2 W2\n");
  EXPECT_NO_THROW(validate(eager));
  const Schedule deferred = no_pipelining(3, true);
  EXPECT_EQ(describe(deferred), "stage 0: F0 B0 F1 B1 F2 B2 W0 W1 W2\n");
  EXPECT_NO_THROW(validate(deferred));
  EXPECT_THROW(no_pipelining(0), Error);
}

TEST(Schedule, ValidateNamesTheOpThatBreaksFBWOrder) {
  Schedule s = no_pipelining(2);
  std::swap(s.ops[0][0], s.ops[0][1]);  // B0 before F0
  EXPECT_NE(error_of(s).find("stage 0 op B0: expected F next"), std::string::npos) << error_of(s);

  s = no_pipelining(2);
  s.ops[0].pop_back();  // W1 missing
  EXPECT_NE(error_of(s).find("micro-batch 1 chunk 0 stops after 2 of its F, B, W"), std::string::npos) << error_of(s);

  s = no_pipelining(2);
  s.ops[0].push_back({OpKind::Forward, 0});  // F0 twice
  EXPECT_NE(error_of(s).find("op F0: expected nothing more"), std::string::npos) << error_of(s);

  s = no_pipelining(2);
  s.ops[0][3].microbatch = 2;  // out of range
  EXPECT_NE(error_of(s).find("micro-batch out of range"), std::string::npos) << error_of(s);

  s = no_pipelining(1);
  s.ops[0][2].chunk = 1;
  EXPECT_NE(error_of(s).find("chunk out of range"), std::string::npos) << error_of(s);

  s = no_pipelining(1);
  s.stages = 2;
  EXPECT_NE(error_of(s).find("lists 1 stages' ops for 2 stages"), std::string::npos) << error_of(s);
}
