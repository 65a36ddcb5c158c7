// `megaton plan`'s prediction of one training step of a configuration on a system: the schedule
// the engine would run (pipeline::generate with c's kind, stages and micro-batches) simulated with
// each model chunk's modelled F / B / W times (chunk_costs.h), then what follows the last backward
// on each pipeline rank: the data-parallel gradient reduction (bucketed, overlapped with the last
// micro-batch's backward as the engine does under overlap_grad_reduce; reduce-scatter with the
// distributed optimizer, the expert buckets over the expert-data-parallel group), DualPipe's
// mirrored-pair sum, the tied embedding's sum over the first and last stages, the optimizer step,
// and the distributed optimizer's parameter all-gather (hidden behind the next forward under
// overlap_param_gather). Memory per pipeline rank from memory_model.h with the schedule's peak of
// micro-batch chunks in flight.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megaton/pipeline/simulator.h"
#include "megaton/plan/chunk_costs.h"
#include "megaton/plan/memory_model.h"
#include "megaton/plan/system.h"
#include "megaton/train/train_config.h"

namespace megaton::plan {

struct StagePlan {
  double pipeline_end_s = 0;    // this rank's last op of the schedule ends
  double busy_s = 0;            // its ops' total time (compute + memory + overheads + tp / ep waits)
  double compute_s = 0;         // of which GEMMs, attention, memory-bound kernels and overheads
  double comm_s = 0;            // of which tensor- / expert-parallel waits
  double p2p_s = 0;             // pipeline transfers this rank waits for (in its idle time)
  double grad_sync_s = 0;       // data-parallel (and pair / embedding) gradient sums not hidden
  double optimizer_s = 0;
  double param_gather_s = 0;    // distributed optimizer's all-gather not hidden
  int64_t in_flight = 0;        // most micro-batch chunks holding activations at once
  MemoryBreakdown memory;       // the allocator's predicted peak per category
  double peak_memory_bytes = 0;
};

struct StepPlan {
  std::string schedule;
  int64_t devices = 0, microbatches = 0;
  double step_time_s = 0, tokens_per_s = 0, mfu = 0;
  // The step's breakdown on its critical pipeline rank (the busiest): compute + comm + bubble + grad_sync +
  // optimizer + param_gather = step time.
  double compute_s = 0, comm_s = 0, bubble_s = 0, grad_sync_s = 0, optimizer_s = 0, param_gather_s = 0;
  int64_t critical_stage = 0;
  double peak_memory_bytes = 0;  // the largest rank's
  int64_t peak_memory_stage = 0;
  std::vector<StagePlan> stages;
  std::vector<ChunkCost> chunks;  // per model chunk in layer order
  pipeline::Simulation simulation;
};

// The op lists c runs: its pipeline_schedule over pp stages and its micro-batches (without pipelining
// the micro-batches one after another on one stage).
pipeline::Schedule step_schedule(const train::TrainConfig& c);

// c with resolve_parallel_layout applied for the run's world size; `schedule`: step_schedule(c),
// when the caller has it already (the search plans many layouts over the same lists).
StepPlan plan_step(const train::TrainConfig& c, const SystemSpec& s, const pipeline::Schedule* schedule = nullptr);

nlohmann::json to_json(const StepPlan& p, const train::TrainConfig& c, const SystemSpec& s);
// A Chrome trace of the simulated step: one row per pipeline rank, the schedule's ops on one
// thread, the gradient reduction, optimizer and gather on the other.
void write_plan_trace(const std::string& path, const StepPlan& p);

}  // namespace megaton::plan
