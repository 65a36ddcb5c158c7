// The step prediction: the pipeline part is the simulator run over the engine's own op lists with
// the cost model's per-chunk times (no schedule re-implemented), the rest of the step adds up,
// the data-parallel reduction hides behind the last backward only as far as it can, and memory
// follows the schedule's micro-batches in flight.
#include "megaton/plan/step_plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "../support/temp_dir.h"
#include "megaton/pipeline/generators.h"
#include "megaton/plan/shipped_systems.h"
#include "megaton/train/pipeline_layout.h"

using namespace megaton;
using namespace megaton::plan;

namespace {

train::TrainConfig config(std::vector<std::string> sets, int64_t world) {
  sets.insert(sets.begin(), {"training.micro_batch_size=2", "training.seq_length=64", "training.global_batch_size=16",
                             "model.num_layers=8"});
  train::TrainConfig c = train::load_train_config("", sets);
  train::resolve_parallel_layout(c, world);
  return c;
}

}  // namespace

TEST(StepPlan, ThePipelineIsTheSimulatorOverTheEnginesOpLists) {
  SystemSpec s = *shipped_system("h100");
  s.intra_node.busy_send_delay_s = 1e-3;  // as a calibrated CPU link has it: every boundary pays it
  for (const std::string kind : {"1f1b", "interleaved", "zb-h1", "zb-h2", "zbv", "dualpipev", "dualpipe"}) {
    SCOPED_TRACE(kind);
    std::vector<std::string> sets = {"pp=4", "parallel.pipeline_schedule=\"" + kind + "\""};
    if (kind == "interleaved") sets.push_back("parallel.virtual_pipeline_model_parallel_size=2");
    const train::TrainConfig c = config(sets, 4);
    const StepPlan p = plan_step(c, s);
    const models::StageLayout layout = train::pipeline_layout(c);
    pipeline::OpCosts costs;
    for (size_t mc = 0; mc < layout.num_chunks(); ++mc) {
      const ChunkCost k = chunk_cost(c, s, layout, int64_t(mc));
      costs.per_chunk.push_back({k.forward.seconds(), k.backward_input.seconds(), k.backward_weight.seconds()});
    }
    costs.transfer = collective_seconds(s, Collective::SendRecv, {2, 1}, 2.0 * 64 * 192 * 4) + 1e-3;
    const pipeline::Simulation sim = pipeline::simulate(
        pipeline::generate(kind, 4, int(train::pipeline_chunks_per_rank(c)), c.grad_accum_steps()), costs);
    EXPECT_DOUBLE_EQ(p.simulation.step_time, sim.step_time);
    EXPECT_EQ(p.simulation.peak_activations, sim.peak_activations);
    // The breakdown adds up to the step on its critical rank.
    EXPECT_NEAR(p.compute_s + p.comm_s + p.bubble_s + p.grad_sync_s + p.optimizer_s + p.param_gather_s, p.step_time_s,
                1e-12 * p.step_time_s);
    EXPECT_GT(p.bubble_s, 0.0);
    EXPECT_GT(p.mfu, 0.0);
    EXPECT_LT(p.mfu, 1.0);
  }
}

TEST(StepPlan, WithoutPipeliningTheStepIsItsMicroBatchesThenTheOptimizer) {
  const SystemSpec s = *shipped_system("h100");
  const train::TrainConfig c = config({}, 1);
  const StepPlan p = plan_step(c, s);
  const ChunkCost k = chunk_cost(c, s, train::pipeline_layout(c), 0);
  const double m = double(c.grad_accum_steps());
  EXPECT_NEAR(p.step_time_s, m * (k.forward.seconds() + k.backward_input.seconds() + k.backward_weight.seconds()) +
                                 p.optimizer_s, 1e-12);
  EXPECT_EQ(p.grad_sync_s, 0.0);
  EXPECT_DOUBLE_EQ(p.tokens_per_s, 16.0 * 64 / p.step_time_s);
}

TEST(StepPlan, DataParallelReductionHidesBehindTheLastBackwardOnlyWhenOverlapped) {
  SystemSpec s = *shipped_system("h100");
  // A slow link, so the reduction outlasts the backward it overlaps.
  s.intra_node.bandwidth_Bps = 1e8;
  const std::vector<std::string> small_buckets = {"parallel.bucket_size=20000"};
  std::vector<std::string> off = small_buckets;
  off.push_back("parallel.overlap_grad_reduce=false");
  const StepPlan overlapped = plan_step(config(small_buckets, 4), s), serial = plan_step(config(off, 4), s);
  EXPECT_GT(serial.grad_sync_s, overlapped.grad_sync_s);
  EXPECT_GT(overlapped.grad_sync_s, 0.0);
  // The distributed optimizer reduce-scatters (half the all-reduce's bytes) and gathers afterwards.
  std::vector<std::string> dist = off;
  dist.push_back("parallel.use_distributed_optimizer=true");
  const StepPlan d = plan_step(config(dist, 4), s);
  EXPECT_LT(d.grad_sync_s, serial.grad_sync_s);
  EXPECT_GT(d.param_gather_s, 0.0);
  EXPECT_LT(d.stages[0].memory.optimizer, serial.stages[0].memory.optimizer);
}

TEST(StepPlan, OneFOneBsFirstStageHoldsEveryStagesMicroBatches) {
  const SystemSpec s = *shipped_system("h100");
  const StepPlan p = plan_step(config({"pp=4"}, 4), s);
  ASSERT_EQ(p.stages.size(), 4u);
  for (size_t r = 0; r < 4; ++r) EXPECT_EQ(p.stages[r].in_flight, int64_t(4 - r));
  EXPECT_GT(p.stages[0].memory.activations, p.stages[2].memory.activations);
}

TEST(StepPlan, JsonCarriesTheFiguresAndTheTraceIsWritten) {
  const SystemSpec s = *shipped_system("h100");
  const train::TrainConfig c = config({"pp=2"}, 2);
  const StepPlan p = plan_step(c, s);
  const nlohmann::json j = to_json(p, c, s);
  for (const char* key : {"step_time_s", "tokens_per_s", "mfu", "peak_memory_bytes"}) {
    ASSERT_TRUE(j.contains(key)) << key;
    EXPECT_TRUE(std::isfinite(j[key].get<double>())) << key;
  }
  EXPECT_EQ(j["stages"].size(), 2u);
  megaton::testing::TempDir dir;
  const std::string path = dir.file("trace.json");
  write_plan_trace(path, p);
  std::ifstream in(path);
  const nlohmann::json trace = nlohmann::json::parse(in);
  size_t spans = 0;
  for (const auto& e : trace["traceEvents"]) spans += e.value("name", "") == "optimizer";
  EXPECT_EQ(spans, 2u);
}
