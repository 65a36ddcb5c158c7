// Schedule generators and their validation.
#include "megaton/pipeline/generators.h"

#include <gtest/gtest.h>

#include "../support/temp_dir.h"
#include "megaton/core/error.h"

using namespace megaton;
using namespace megaton::pipeline;


TEST(Schedule, NoPipeliningRunsFBWPerMicrobatchOrDefersEveryW) {
  const Schedule eager = no_pipelining(3);
  EXPECT_EQ(describe(eager), "stage 0: F0 B0 W0 F1 B1 W1 F2 B2 W2\n");
  EXPECT_NO_THROW(validate(eager));
  const Schedule deferred = no_pipelining(3, true);
  EXPECT_EQ(describe(deferred), "stage 0: F0 B0 F1 B1 F2 B2 W0 W1 W2\n");
  EXPECT_NO_THROW(validate(deferred));
  EXPECT_THROW(no_pipelining(0), Error);
  // Two model chunks: forward through both, backward back down, each chunk's W after its B or at the end.
  EXPECT_EQ(describe(no_pipelining(2, false, 2)), "stage 0: F0 F0.1 B0.1 W0.1 B0 W0 F1 F1.1 B1.1 W1.1 B1 W1\n");
  EXPECT_EQ(describe(no_pipelining(2, true, 2)), "stage 0: F0 F0.1 B0.1 B0 F1 F1.1 B1.1 B1 W0.1 W0 W1.1 W1\n");
  EXPECT_NO_THROW(validate(no_pipelining(2, true, 2)));
  EXPECT_THROW(no_pipelining(1, false, 0), Error);
}

TEST(Schedule, ValidateNamesTheOpThatBreaksFBWOrder) {
  Schedule s = no_pipelining(2);
  std::swap(s.ops[0][0], s.ops[0][1]);  // B0 before F0
  EXPECT_ERROR_CONTAINS(validate(s), "stage 0 op B0: expected F next");

  s = no_pipelining(2);
  s.ops[0].pop_back();  // W1 missing
  EXPECT_ERROR_CONTAINS(validate(s), "micro-batch 1 chunk 0 stops after 2 of its F, B, W");

  s = no_pipelining(2);
  s.ops[0].push_back({OpKind::Forward, 0});  // F0 twice
  EXPECT_ERROR_CONTAINS(validate(s), "op F0: expected nothing more");

  s = no_pipelining(2);
  s.ops[0][3].microbatch = 2;  // out of range
  EXPECT_ERROR_CONTAINS(validate(s), "micro-batch out of range");

  s = no_pipelining(1);
  s.ops[0][2].chunk = 1;
  EXPECT_ERROR_CONTAINS(validate(s), "chunk out of range");

  s = no_pipelining(1);
  s.stages = 2;
  EXPECT_ERROR_CONTAINS(validate(s), "lists 1 stages' ops for 2 stages");
}

TEST(Schedule, OneFOneBAndZbH1OrderTheirOps) {
  EXPECT_EQ(describe(one_f_one_b(2, 3)), "stage 0: F0 F1 B0 W0 F2 B1 W1 B2 W2\n"
                                         "stage 1: F0 B0 W0 F1 B1 W1 F2 B2 W2\n");
  // The last stage defers each W by one micro-batch, so its input gradients leave at B's pace.
  EXPECT_EQ(describe(zb_h1(2, 3)), "stage 0: F0 F1 B0 W0 F2 B1 W1 B2 W2\n"
                                   "stage 1: F0 B0 F1 B1 W0 F2 B2 W1 W2\n");
  // Interleaved, p = 2, v = 2: forwards in groups of two micro-batches per chunk.
  EXPECT_EQ(describe(interleaved_1f1b(2, 2, 2)), "stage 0: F0 F1 F0.1 F1.1 B0.1 W0.1 B1.1 W1.1 B0 W0 B1 W1\n"
                                                 "stage 1: F0 F1 F0.1 B0.1 W0.1 F1.1 B1.1 W1.1 B0 W0 B1 W1\n");
  EXPECT_THROW(one_f_one_b(0, 2), Error);
  EXPECT_THROW(zb_h1(2, 0), Error);
}

TEST(Schedule, ZbH2AndDualPipeVOrderTheirOps) {
  // ZB-H2, p = 2, m = 3 (by hand, unit steps): stage 0 fills the wait for B0 with three forwards
  // (2p-1 in flight); stage 1 runs F B F B F B and leaves every W to the tail.
  EXPECT_EQ(describe(zb_h2(2, 3)), "stage 0: F0 F1 F2 B0 W0 B1 W1 B2 W2\n"
                                   "stage 1: F0 B0 F1 B1 F2 B2 W0 W1 W2\n");
  // DualPipeV, p = 2, m = 4: stage 0 holds model chunks 0 and 3, stage 1 chunks 1 and 2. Stage 0:
  // 2 chunk-0 forwards, F0 F1 pair, B1 (W deferred, gradient sent first) W F1, one main
  // F0 B1 F1 B0 round, B1 F1 B0, then B1 B0 with the last W deferred, W B0, W.
  const Schedule v = dualpipev(2, 4);
  EXPECT_EQ(describe(v),
            "stage 0: F0 F1 F2 F0.1 B0.1 sendB0.1 W0.1 F1.1 F3 B1.1 W1.1 F2.1 B0 W0 B2.1 W2.1 F3.1 B1 W1 B3.1 W3.1 B2 W2 B3 W3\n"
            "stage 1: F0 F0.1 F1 F1.1 F2 B0.1 W0.1 F2.1 B0 W0 F3 B1.1 W1.1 F3.1 B1 W1 B2.1 W2.1 B2 W2 B3.1 B3 W3.1 W3\n");
  EXPECT_EQ(v.model_chunk, (std::vector<std::vector<int>>{{0, 3}, {1, 2}}));
  EXPECT_THROW(zb_h2(0, 2), Error);
  EXPECT_ERROR_CONTAINS(generate("dualpipev", 2, 1, 4), "two model chunks per stage");
  EXPECT_EQ(generate("zb-h2", 2, 1, 3).name, "zb-h2");
}
