// The simulator against the published bubbles of each generator (B = input gradient only, W =
// weight gradient), their activation peaks, and deadlock detection.
#include "megaton/pipeline/simulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "../support/temp_dir.h"
#include "megaton/core/error.h"
#include "megaton/pipeline/generators.h"

using namespace megaton;
using namespace megaton::pipeline;

namespace {

const OpCosts kCosts[] = {{1, 1, 1, 0}, {2, 1, 1, 0}};

std::string costs_str(const OpCosts& c) {
  return "F=" + std::to_string(c.forward) + " B=" + std::to_string(c.backward_input) +
         " W=" + std::to_string(c.backward_weight);
}

// Every stage does m (or m * chunks, over the copies) of each op; the rest of the step is bubble.
void expect_step(const Schedule& s, const OpCosts& c, double bubble) {
  SCOPED_TRACE(s.name + " p=" + std::to_string(s.stages) + " v=" + std::to_string(s.chunks_per_stage) +
               " m=" + std::to_string(s.microbatches) + " " + costs_str(c));
  const double work = static_cast<double>(s.microbatches * s.chunks_per_stage / s.copies) *
                      (c.forward + c.backward_input + c.backward_weight);
  const Simulation sim = simulate(s, c);
  EXPECT_DOUBLE_EQ(sim.step_time, work + bubble);
  EXPECT_NEAR(sim.bubble_fraction, 1.0 - work / (work + bubble), 1e-12);
}

}  // namespace

TEST(Simulator, OneFOneBAndZbH1HaveThePublishedBubbles) {
  for (int p : {2, 4, 8})
    for (int64_t m : {int64_t{p}, int64_t{2 * p}, int64_t{3 * p + 1}})
      for (const OpCosts& c : kCosts) {
        const double F = c.forward, B = c.backward_input, W = c.backward_weight;
        expect_step(one_f_one_b(p, m), c, (p - 1) * (F + B + W));
        expect_step(zb_h1(p, m), c, (p - 1) * (F + B - W));
      }
}

TEST(Simulator, InterleavingDividesTheBubbleByTheChunks) {
  for (int p : {2, 4})
    for (int v : {2, 3})
      for (int64_t m : {int64_t{p}, int64_t{2 * p}})
        for (const OpCosts& c : kCosts)  // per-chunk costs: the bubble is 1F1B's over v
          expect_step(interleaved_1f1b(p, v, m), c, (p - 1) * (c.forward + c.backward_input + c.backward_weight));
  EXPECT_ERROR_CONTAINS(interleaved_1f1b(4, 2, 6), "multiple of the pipeline stages");
}

// What each compute part finds held when it starts, ZB-H1 on 2 stages: the first stage runs every W right
// after its B (one call), the last defers them, so a finished B leaves its W's inputs behind while the
// next micro-batch runs (planted: every B counted as fused, caught).
TEST(Simulator, LiveActivationsTellSavedFromHeldForW) {
  const Simulation sim = simulate(zb_h1(2, 4), {});
  const auto as_text = [](const std::vector<LiveActivations>& live) {
    std::string out;
    for (const LiveActivations& e : live)
      out += std::string(e.kind == OpKind::Forward         ? "F"
                         : e.kind == OpKind::BackwardInput ? "B"
                                                           : "W") +
             (e.with_weight ? "+W" : "") + "(" + std::to_string(e.saved) + "," + std::to_string(e.held_for_w) + ") ";
    return out;
  };
  // Stage 0: F0 F1 B0W0 F2 B1W1 F3 B2W2 B3W3.
  EXPECT_EQ(as_text(sim.live[0]), "F(0,0) F(1,0) B+W(1,0) F(1,0) B+W(1,0) F(1,0) B+W(1,0) B+W(0,0) ");
  // Stage 1: F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3.
  EXPECT_EQ(as_text(sim.live[1]),
            "F(0,0) B(0,0) F(0,1) B(0,1) W(0,1) F(0,1) B(0,1) W(0,1) F(0,1) B(0,1) W(0,1) W(0,0) ");
}

TEST(Simulator, ActivationPeaksAsPublished) {
  for (int p : {2, 4, 8}) {
    const int64_t m = 3 * p;
    EXPECT_EQ(simulate(one_f_one_b(p, m), {}).peak_activations.front(), p) << "1F1B p=" << p;
    const Simulation zb = simulate(zb_h1(p, m), {});
    EXPECT_EQ(*std::max_element(zb.peak_activations.begin(), zb.peak_activations.end()), p) << "ZB-H1 p=" << p;
    // Interleaved: Megatron's warm-up of 2(p-1) + (v-1)p forwards, then one more.
    EXPECT_EQ(simulate(interleaved_1f1b(p, 2, m), {}).peak_activations.front(), 2 * (p - 1) + p + 1) << "p=" << p;
  }
  // One stage: no bubble whatever W's place.
  expect_step(no_pipelining(3), {}, 0);
  expect_step(no_pipelining(3, true, 2), {}, 0);
}

TEST(Simulator, TransfersBetweenStagesLengthenTheStep) {
  const Simulation sim = simulate(one_f_one_b(2, 2), {1, 1, 1, 0.5});
  // Stage 1: F0 from 1.5, its fused B0 + W0 until 4.5, F1 until 5.5, B1 + W1 until 7.5. Stage 0:
  // B0 + W0 from 5 (4.5 + the transfer), B1 + W1 from 8 until 10.
  EXPECT_DOUBLE_EQ(sim.step_time, 10.0);
}

TEST(Simulator, ADeadlockNamesEveryBlockedStage) {
  Schedule s{"crossed", 2, 1, 2, {}, {}};
  s.ops = {{{OpKind::Forward, 0}, {OpKind::BackwardInput, 0}, {OpKind::BackwardWeight, 0},
            {OpKind::Forward, 1}, {OpKind::BackwardInput, 1}, {OpKind::BackwardWeight, 1}},
           {{OpKind::Forward, 1}, {OpKind::BackwardInput, 1}, {OpKind::BackwardWeight, 1},
            {OpKind::Forward, 0}, {OpKind::BackwardInput, 0}, {OpKind::BackwardWeight, 0}}};
  EXPECT_ERROR_CONTAINS(simulate(s, {}), "schedule 'crossed' deadlocks: stage 0 waits at B0; stage 1 waits at F1;");
}

namespace {

// The most idle time of any stage between its own first op's start and last op's end: the bubble
// the Zero Bubble paper counts (with its optimizer post-validation a stage starts the next step
// as soon as it is done, so the stages' start offsets overlap from step to step).
double largest_stage_bubble(const Simulation& sim) {
  double worst = 0;
  for (const auto& ops : sim.timeline) {
    double busy = 0;
    for (const TimedOp& t : ops) busy += t.end - t.start;
    worst = std::max(worst, ops.back().end - ops.front().start - busy);
  }
  return worst;
}

}  // namespace

// ZB-H2 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", section 2.2 and figure 3): peak
// memory (2p-1) micro-batches, zero bubble at F = B = W. Per stage the idle time within its own
// span is (p-1)(F+B-2W) floored at 0, for m >= 2p-1 (fewer micro-batches cannot fill the
// warm-up); the whole step is m(F+B+W) + (p-1)F, the (p-1)F being the last stage's wait for its
// first input, which no schedule avoids.
TEST(Simulator, ZbH2HasZeroBubbleWithinEachStage) {
  for (int p : {2, 4, 8})
    for (int64_t m : {int64_t{2 * p - 1}, int64_t{2 * p}, int64_t{3 * p + 1}, int64_t{4 * p}})
      for (const OpCosts& c : {kCosts[0], kCosts[1], OpCosts{1, 2, 1, 0}, OpCosts{1, 1, 2, 0}, OpCosts{3, 2, 1, 0}}) {
        const Schedule s = zb_h2(p, m);
        expect_step(s, c, (p - 1) * c.forward);
        const double per_stage = std::max(0.0, (p - 1) * (c.forward + c.backward_input - 2 * c.backward_weight));
        EXPECT_DOUBLE_EQ(largest_stage_bubble(simulate(s, c)), per_stage) << "p=" << p << " m=" << m << " " << costs_str(c);
        EXPECT_EQ(simulate(s, c).peak_activations.front(), 2 * p - 1) << "p=" << p << " m=" << m;
      }
  // 1F1B counted the same way keeps its whole bubble on the first stage.
  EXPECT_DOUBLE_EQ(largest_stage_bubble(simulate(one_f_one_b(4, 8), {})), 3 * 3);
}

// The DualPipe README's bubble (PP/2-1)(F&B + B - 3W), PP pipeline stages (model chunks of one
// copy), B the full backward (our B + W), F&B an overlapped forward and full backward (our F&B op
// and its W): in our terms (PP/2-1)(FB + B - W). Activations PP+1 chunk units per device; DualPipe
// keeps 2 parameter copies, DualPipeV 1 (two half-size chunks). At F = B = W the simulated step
// is the published bubble exactly, for DualPipe (PP = p) and DualPipeV (PP = 2p) alike.
TEST(Simulator, DualPipeAndDualPipeVHaveThePublishedBubbleAndActivations) {
  for (const OpCosts& c : {OpCosts{1, 1, 1, 0}, OpCosts{2, 2, 2, 0}}) {
    const double FB = c.forward + c.backward_input, B = c.backward_input, W = c.backward_weight;
    for (int p : {2, 4, 6, 8})
      for (int64_t m : {int64_t{2 * p}, int64_t{2 * p + 2}, int64_t{3 * p + p % 4}, int64_t{4 * p}}) {
        const Schedule s = dualpipe(p, m);
        expect_step(s, c, (p / 2 - 1) * (FB + B - W));
        const Simulation sim = simulate(s, c);
        EXPECT_EQ(sim.peak_activations, std::vector<int>(static_cast<size_t>(p), p + 1)) << "p=" << p << " m=" << m;
        EXPECT_EQ(sim.param_copies, std::vector<int>(static_cast<size_t>(p), 2));
      }
    for (int p : {2, 3, 4, 8})
      for (int64_t m : {int64_t{2 * p}, int64_t{2 * p + 1}, int64_t{3 * p}, int64_t{4 * p}}) {
        const Schedule s = dualpipev(p, m);
        expect_step(s, c, (p - 1) * (FB + B - W));
        const Simulation sim = simulate(s, c);
        EXPECT_EQ(sim.peak_activations, std::vector<int>(static_cast<size_t>(p), 2 * p + 1)) << "p=" << p << " m=" << m;
        EXPECT_EQ(sim.param_copies, std::vector<int>(static_cast<size_t>(p), 1));
      }
  }
  EXPECT_ERROR_CONTAINS(dualpipev(4, 7), "at least twice as many micro-batches");
}

// At F=2, B=1, W=1 the published formula gives (PP/2-1)(F+2B-W) = 3(PP/2-1); the exact simulation
// of the lists gives 2F(PP/2-1) = 4(PP/2-1) (the two agree when F = 2B - W, e.g. F = B = W). Worked
// out by hand at p = 4 (lists in schedule_test): stage 1 runs five forwards, then B4.1 + W, then
// F6.1&B0 + W, ending at 6F + B + 2W + FB = 18; stage 0 is free for its F6.1&B0 at
// max(4F + B + W, 5F) + F + FB + W = 16, so it waits min(F, B + W) = 2 for B0's gradient, and once
// more as long before F7.1&B1: the round trip of a stage's first gradients grows with F, which the
// published estimate leaves out. An independent transcription of dualpipe.py's phases and of these
// dependency rules (in Python) gives the same 4(PP/2-1) for p up to 8.
TEST(Simulator, DualPipeWithASlowerForwardWaitsLongerThanPublished) {
  const OpCosts c = kCosts[1];
  for (int p : {2, 4, 6, 8})
    for (int64_t m : {int64_t{2 * p}, int64_t{4 * p}}) {
      expect_step(dualpipe(p, m), c, (p / 2 - 1) * 2 * c.forward);
      const double published = (p / 2 - 1) * (c.forward + 2 * c.backward_input - c.backward_weight);
      EXPECT_GE(simulate(dualpipe(p, m), c).step_time, m * 4.0 + published);
    }
  for (int p : {2, 3, 4})
    expect_step(dualpipev(p, 3 * p), c, (p - 1) * 2 * c.forward);
}

// The F&B's own cost replaces F + B, and the op waits for both of its inputs: DualPipe p = 2, m = 4
// (see schedule_test for the lists), unit costs, transfers of 0.5. Stage 0: F0 [0,1], F2.1 [1.5,2.5]
// (stage 1's F2.1 ended at 1), F1 [2.5,3.5], B2.1 + W [3.5,5.5]; then F3.1&B0, whose F3.1 input is
// there at 4 (stage 1's F3.1 [2.5,3.5]) but whose B0 gradient is not before 6 (stage 1's B0 + W
// [3.5,5.5]): [6, 6+FB], though the stage is free at 5.5.
TEST(Simulator, AnOverlappedForwardBackwardHasItsOwnCostAndWaitsForBothInputs) {
  for (double fb : {0.0, 1.5, 3.0}) {
    const Simulation sim = simulate(dualpipe(2, 4), {1, 1, 1, 0.5, fb});
    const TimedOp& pair = sim.timeline[0][5];
    EXPECT_EQ(op_name(pair.op), "F3.1&B0");
    EXPECT_DOUBLE_EQ(pair.start, 6.0) << fb;
    EXPECT_DOUBLE_EQ(pair.end, 6.0 + (fb > 0 ? fb : 2.0)) << fb;
  }
  EXPECT_DOUBLE_EQ(simulate(dualpipe(2, 4), {1, 1, 1, 0, 1.5}).step_time, 12 - 0.5);  // one F&B per stage, no bubble
}

// ZB-V (Qi et al., arXiv 2401.10241 section 6; the repository's table): zero bubble when F = B = W
// with 1F1B's activation memory. Each stage is busy from its first op to its last; the step is the
// work plus (p-1)F, the last stage's wait for its first input (post-validation overlaps it with the
// previous step, as for ZB-H2); every stage peaks at 2p chunk activations, chunks of 1/(2p) of the
// model: p whole stages, 1F1B's first-stage peak.
TEST(Simulator, ZbVHasZeroBubbleAndTheActivationsOf1F1B) {
  for (int p : {1, 2, 3, 4, 8})
    for (int64_t m : {int64_t{2 * p - 1}, int64_t{2 * p}, int64_t{3 * p + 1}, int64_t{4 * p}})
      for (const OpCosts& c : {OpCosts{1, 1, 1, 0}, OpCosts{2, 2, 2, 0}}) {
        const Schedule s = zbv(p, m);
        expect_step(s, c, (p - 1) * c.forward);
        const Simulation sim = simulate(s, c);
        EXPECT_DOUBLE_EQ(largest_stage_bubble(sim), 0) << "p=" << p << " m=" << m;
        EXPECT_EQ(sim.peak_activations, std::vector<int>(static_cast<size_t>(p), 2 * p)) << "p=" << p << " m=" << m;
        const Simulation one_f_one_b_sim = simulate(one_f_one_b(p, m), c);
        EXPECT_EQ(2 * one_f_one_b_sim.peak_activations.front(), sim.peak_activations.front());  // same bytes
      }
}

// The paper states ZB-V's bubble for F = B = W only (its order is built for equal costs). At F=2,
// B=1, W=1 it still cannot beat the last stage's start offset, and at the same activation memory
// it beats ZB-H1 (whose per-stage costs are two chunks': F=4, B=2, W=2, bubble (p-1)(F+B-W)).
TEST(Simulator, ZbVWithASlowerForwardStaysBelowZbH1) {
  const OpCosts c = kCosts[1], stage{4, 2, 2, 0};
  for (int p : {2, 3, 4, 8})
    for (int64_t m : {int64_t{2 * p - 1}, int64_t{3 * p}}) {
      const double work = 2.0 * static_cast<double>(m) * (c.forward + c.backward_input + c.backward_weight);
      const double step = simulate(zbv(p, m), c).step_time;
      EXPECT_GE(step, work + (p - 1) * c.forward) << "p=" << p << " m=" << m;
      EXPECT_LT(step, simulate(zb_h1(p, m), stage).step_time) << "p=" << p << " m=" << m;
    }
}

// Every generator, over sizes each accepts: on every stage each micro-batch's F, B and W run
// exactly once on each chunk it passes (its copy's), F before B before W, and the stages' lists
// together run to the end (the simulator fails on a deadlock). Counted here from the lists
// themselves, not by validate().
TEST(Simulator, EveryGeneratorRunsEachFBWOnceInOrderWithoutDeadlock) {
  for (const std::string& kind : schedule_kinds())
    for (int p = 1; p <= 8; ++p)
      for (int v : {1, 2, 3})
        for (int64_t m = 1; m <= 4 * p + 1; ++m) {
          // The sizes each kind takes (its generator refuses the others, tested in schedule_test).
          const bool v_ok = kind == "none" || kind == "interleaved" ? true
                            : kind == "zbv" || kind == "dualpipe" || kind == "dualpipev" ? v == 2
                                                                                         : v == 1;
          const bool takes = v_ok && (kind != "none" || p == 1) && (kind != "interleaved" || m % p == 0) &&
                             (kind != "dualpipev" || m >= 2 * p) &&
                             (kind != "dualpipe" || (p % 2 == 0 && m % 2 == 0 && m >= 2 * p));
          if (!takes) continue;
          SCOPED_TRACE(kind + " p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m));
          const Schedule s = generate(kind, p, v, m);
          for (int st = 0; st < p; ++st) {
            std::map<std::tuple<int64_t, int, OpKind>, std::vector<size_t>> at;  // where each F / B / W runs
            const auto& ops = s.ops[static_cast<size_t>(st)];
            for (size_t i = 0; i < ops.size(); ++i) {
              if (ops[i].kind == OpKind::ForwardBackward) {
                at[{ops[i].microbatch, ops[i].chunk, OpKind::Forward}].push_back(i);
                at[{ops[i].backward_microbatch, ops[i].backward_chunk, OpKind::BackwardInput}].push_back(i);
              } else if (ops[i].kind == OpKind::Forward || ops[i].kind == OpKind::BackwardInput ||
                         ops[i].kind == OpKind::BackwardWeight) {
                at[{ops[i].microbatch, ops[i].chunk, ops[i].kind}].push_back(i);
              }
            }
            size_t expected = 0;
            for (int64_t mb = 0; mb < m; ++mb)
              for (int c = 0; c < v; ++c) {
                if (s.copy_of(st, c) != mb * s.copies / m) continue;
                expected += 3;
                const auto& f = at[{mb, c, OpKind::Forward}];
                const auto& b = at[{mb, c, OpKind::BackwardInput}];
                const auto& w = at[{mb, c, OpKind::BackwardWeight}];
                ASSERT_TRUE(f.size() == 1 && b.size() == 1 && w.size() == 1)
                    << "stage " << st << " mb " << mb << " chunk " << c;
                EXPECT_TRUE(f[0] < b[0] && b[0] < w[0]) << "stage " << st << " mb " << mb << " chunk " << c;
              }
            EXPECT_EQ(at.size(), expected) << "stage " << st << ": ops of micro-batches / chunks that do not run here";
          }
          EXPECT_NO_THROW(simulate(s, kCosts[1]));
        }
}

TEST(Simulator, PerChunkCostsEqualToUniformOnesGiveTheSameTimeline) {
  for (const std::string kind : {"1f1b", "interleaved", "zb-h2", "zbv", "dualpipe", "dualpipev"}) {
    SCOPED_TRACE(kind);
    const int chunks = kind == "1f1b" || kind == "zb-h2" ? 1 : 2;
    const Schedule s = generate(kind, 4, chunks, 8);
    OpCosts uniform{2, 1.5, 1, 0.1};
    OpCosts per = uniform;
    per.per_chunk.assign(static_cast<size_t>(s.model_chunks()), ChunkCosts{2, 1.5, 1});
    const Simulation a = simulate(s, uniform), b = simulate(s, per);
    EXPECT_DOUBLE_EQ(a.step_time, b.step_time);
    EXPECT_EQ(a.peak_activations, b.peak_activations);
  }
}

TEST(Simulator, ASlowerFirstChunkDelaysEveryLaterStage) {
  // 1F1B at p = 2, m = 2: the first stage's forward costs 3 instead of 1, so the step grows by
  // 2 per micro-batch's forward on the critical path: F0 F1 on stage 0 (6), then stage 1 catches up.
  const Schedule s = one_f_one_b(2, 2);
  OpCosts c;
  c.per_chunk = {{3, 1, 1}, {1, 1, 1}};
  const Simulation sim = simulate(s, c);
  // Stage 0: F0 [0,3] F1 [3,6]; stage 1: F0 [3,4] B0+W0 [4,6] F1 [6,7] B1+W1 [7,9]; stage 0: B0+W0 [6,8]
  // B1+W1 [9,11].
  EXPECT_DOUBLE_EQ(sim.step_time, 11.0);
  c.per_chunk = {{1, 1, 1}};
  EXPECT_THROW(simulate(s, c), Error);  // one cost for a schedule of two model chunks
}
