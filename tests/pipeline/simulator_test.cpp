// The simulator against the published bubbles of each generator (B = input gradient only, W =
// weight gradient), their activation peaks, and deadlock detection.
#include "megaton/pipeline/simulator.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "../support/temp_dir.h"
#include "megaton/pipeline/generators.h"

using namespace megaton;
using namespace megaton::pipeline;

namespace {

const OpCosts kCosts[] = {{1, 1, 1, 0}, {2, 1, 1, 0}};

std::string costs_str(const OpCosts& c) {
  return "F=" + std::to_string(c.forward) + " B=" + std::to_string(c.backward_input) +
         " W=" + std::to_string(c.backward_weight);
}

// Every stage does m (or m * chunks) of each op; the rest of the step is bubble.
void expect_step(const Schedule& s, const OpCosts& c, double bubble) {
  SCOPED_TRACE(s.name + " p=" + std::to_string(s.stages) + " v=" + std::to_string(s.chunks_per_stage) +
               " m=" + std::to_string(s.microbatches) + " " + costs_str(c));
  const double work = static_cast<double>(s.microbatches * s.chunks_per_stage) *
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

// DualPipeV (github.com/deepseek-ai/DualPipe README): bubble (PP/2-1)(F&B + B - 3W) with PP = 2p
// pipeline stages (model chunks), B the full backward (our B + W) and F&B an overlapped forward and
// backward pair; activations PP + 1 chunk units per device. The simulator runs the pair one after
// the other (F&B = F + B + W here) and sends a deferred W's gradient before the W, as
// dualpipev.py does; so measured, the bubble is (p-1)F when B = W, below the README's
// (p-1)(F + 2B - W) for these costs. With B != W the step is not that simple (not tested).
TEST(Simulator, DualPipeVBubbleAndActivations) {
  for (int p : {2, 4, 8})
    for (int64_t m : {int64_t{2 * p}, int64_t{2 * p + 1}, int64_t{3 * p}, int64_t{4 * p}}) {
      const Schedule s = dualpipev(p, m);
      for (const OpCosts& c : kCosts) {
        expect_step(s, c, (p - 1) * c.forward);
        const double readme = (p - 1) * (c.forward + 2 * c.backward_input - c.backward_weight);
        EXPECT_LE(simulate(s, c).step_time, 2 * m * (c.forward + c.backward_input + c.backward_weight) + readme);
      }
      const Simulation sim = simulate(s, {});
      for (int peak : sim.peak_activations) EXPECT_EQ(peak, 2 * p + 1) << "p=" << p << " m=" << m;
    }
  EXPECT_ERROR_CONTAINS(dualpipev(4, 7), "at least twice as many micro-batches");
}
