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
  // DualPipeV, p = 2, m = 4, from dualpipev.py's phases: stage 0 holds model chunks 0 and 3, stage 1
  // chunks 1 and 2. Stage 0: 2 chunk-0 forwards, F0 F1 pair, B1 (W deferred, gradient sent first)
  // W F1, one main F0&B1 F1&B0 round (each B with its W), B1 F1&B0, then B1 B0 with the last W
  // deferred, W B0, W. Stage 1, the V's bottom, runs its first main pair apart (F2 then B0.1).
  const Schedule v = dualpipev(2, 4);
  EXPECT_EQ(describe(v),
            "stage 0: F0 F1 F2 F0.1 B0.1 sendB0.1 W0.1 F1.1 F3&B1.1 W1.1 F2.1&B0 W0 B2.1 W2.1 F3.1&B1 W1 B3.1 W3.1 B2 W2 "
            "B3 W3\n"
            "stage 1: F0 F0.1 F1 F1.1 F2 B0.1 W0.1 F2.1&B0 W0 F3&B1.1 W1.1 F3.1&B1 W1 B2.1 W2.1 B2 W2 B3.1 B3 W3.1 W3\n");
  EXPECT_EQ(v.model_chunk, (std::vector<std::vector<int>>{{0, 3}, {1, 2}}));
  EXPECT_THROW(zb_h2(0, 2), Error);
  EXPECT_ERROR_CONTAINS(generate("dualpipev", 2, 1, 4), "two model chunks per stage");
  EXPECT_EQ(generate("zb-h2", 2, 1, 3).name, "zb-h2");
}

TEST(Schedule, ZbVOrdersItsOps) {
  // p = 2, m = 3 (the warm-up's 2p-1): stage 0 holds model chunks 0 and 3, stage 1 chunks 1 and 2.
  // Stage 0: 3 chunk-0 forwards; 2 of F1 B1 W; one steady round with the forwards used up (B0 W F1
  // B1 W); 2 of B0 W. Stage 1: 1 chunk-0 forward; 1 pair F1 F0; 1 of F1 B1 W; one steady round (F0
  // B0 W F1 B1 W); 1 pair B0 B1; 1 of B0 W; then its deferred Ws, oldest first. A W right after its
  // own B follows a SendBackward, except on stage 1's chunk 1, whose gradient stays on the stage.
  const Schedule s = zbv(2, 3);
  EXPECT_EQ(describe(s),
            "stage 0: F0 F1 F2 F0.1 B0.1 sendB0.1 W0.1 F1.1 B1.1 sendB1.1 W1.1 B0 W0 F2.1 B2.1 sendB2.1 W2.1 B1 W1 B2 "
            "W2\n"
            "stage 1: F0 F0.1 F1 F1.1 B0.1 W0.1 F2 B0 sendB0 W0 F2.1 B1.1 W1.1 B1 B2.1 B2 W1 W2.1 W2\n");
  EXPECT_EQ(s.model_chunk, (std::vector<std::vector<int>>{{0, 3}, {1, 2}}));
  EXPECT_EQ(s.copies, 1);
  // One micro-batch: the order built for 2p-1 with the others' ops dropped.
  EXPECT_EQ(describe(zbv(2, 1)), "stage 0: F0 F0.1 B0.1 sendB0.1 W0.1 B0 W0\n"
                                 "stage 1: F0 F0.1 B0.1 W0.1 B0 sendB0 W0\n");
  EXPECT_ERROR_CONTAINS(generate("zbv", 2, 1, 4), "schedule 'zbv' has two model chunks per stage (a V), not 1");
  EXPECT_THROW(zbv(0, 4), Error);
  EXPECT_ERROR_CONTAINS(zbv(1 << 30, int64_t{1} << 40), "pipeline schedule ops: size");  // before any allocation
}

TEST(Schedule, DualPipeRunsEachDirectionOnItsOwnCopy) {
  // p = 2, m = 4: micro-batches 0, 1 enter at stage 0 on copy 0 (chunk 0), 2, 3 at stage 1 on copy 1
  // (chunk 1). Both stages are the last of their half: their first main pair runs apart (F then the
  // B with its W), then F&B of the other direction, then the backwards left, the last W deferred.
  const Schedule s = dualpipe(2, 4);
  EXPECT_EQ(describe(s), "stage 0: F0 F2.1 F1 B2.1 W2.1 F3.1&B0 W0 B3.1 W3.1 B1 W1\n"
                         "stage 1: F2.1 F0 F3.1 B0 W0 F1&B2.1 W2.1 B1 W1 B3.1 W3.1\n");
  EXPECT_EQ(s.copies, 2);
  EXPECT_EQ(s.model_chunk, (std::vector<std::vector<int>>{{0, 1}, {1, 0}}));
  EXPECT_EQ(s.chunk_copy, (std::vector<std::vector<int>>{{0, 1}, {0, 1}}));
  // p = 4, m = 8 (dualpipe.py's phases per half; stages 1 and 2 are the middle ones).
  EXPECT_EQ(describe(dualpipe(4, 8)),
            "stage 0: F0 F1 F2 F4.1 B4.1 sendB4.1 W4.1 F5.1 F3&B5.1 W5.1 F6.1&B0 W0 B6.1 W6.1 F7.1&B1 W1 B7.1 W7.1 B2 W2 "
            "B3 W3\n"
            "stage 1: F0 F4.1 F1 F5.1 F2 B4.1 W4.1 F6.1&B0 W0 F3&B5.1 W5.1 F7.1&B1 W1 B6.1 W6.1 B2 W2 B7.1 B3 W7.1 W3\n"
            "stage 2: F4.1 F0 F5.1 F1 F6.1 B0 W0 F2&B4.1 W4.1 F7.1&B1 W1 F3&B5.1 W5.1 B2 W2 B6.1 W6.1 B3 B7.1 W3 W7.1\n"
            "stage 3: F4.1 F5.1 F6.1 F0 B0 sendB0 W0 F1 F7.1&B1 W1 F2&B4.1 W4.1 B2 W2 F3&B5.1 W5.1 B3 W3 B6.1 W6.1 B7.1 "
            "W7.1\n");
  EXPECT_ERROR_CONTAINS(dualpipe(3, 6), "even number of pipeline stages, not 3");
  EXPECT_ERROR_CONTAINS(dualpipe(4, 9), "even number of micro-batches, at least twice the pipeline stages (4); got 9");
  EXPECT_ERROR_CONTAINS(dualpipe(4, 6), "got 6");
  EXPECT_ERROR_CONTAINS(generate("dualpipe", 4, 1, 8), "two model chunks per stage (one per direction), not 1");
}

TEST(Schedule, ValidateChecksCopiesAndPlacement) {
  Schedule s = dualpipe(2, 4);
  s.ops[0][0] = {OpKind::Forward, 2};  // micro-batch 2 belongs to copy 1, chunk 0 is copy 0
  EXPECT_ERROR_CONTAINS(validate(s), "stage 0 op F2: micro-batch 2 runs on copy 1, chunk 0 is copy 0");

  s = dualpipe(2, 4);
  s.ops[0][5].backward_microbatch = 3;  // the F&B's B part is checked too: micro-batch 3 is copy 1's
  EXPECT_ERROR_CONTAINS(validate(s), "stage 0 op F3.1&B3: micro-batch 3 runs on copy 1, chunk 0 is copy 0");

  s = dualpipe(2, 4);
  s.model_chunk[1] = {0, 0};  // stage 1 chunk 0 would be copy 0's model chunk 0, which stage 0 holds
  EXPECT_ERROR_CONTAINS(validate(s), "stage 1 chunk 0: model chunk 0 of copy 0 is held twice");

  s = dualpipe(2, 4);
  s.chunk_copy[0] = {0, 2};
  EXPECT_ERROR_CONTAINS(validate(s), "copy 2 model chunk 1 out of range (2 copies of 2 model chunks)");

  s = dualpipe(2, 4);
  s.microbatches = 5;
  EXPECT_ERROR_CONTAINS(validate(s), "must be multiples of it");

  s = zbv(2, 3);
  s.model_chunk.pop_back();
  EXPECT_ERROR_CONTAINS(validate(s), "model_chunk lists 1 stages for 2");
}
