// The time one micro-batch spends in one model chunk on one rank, per phase (F, B = input
// gradient, W = weight gradient), from the ops the engine runs there: every GEMM at the system's
// efficiency for its shape and dtype, attention from its efficiency table, the memory-bound kernels
// (norms, activations, residual adds, RoPE, embedding, cross-entropy, MoE permutes) at their share
// of the memory bandwidth, a fixed overhead per kernel, and the tensor- and expert-parallel
// collectives the modules wait on (Megatron-Core's placement: column-parallel linears all-reduce the
// input gradient, row-parallel ones the output; all-gather / reduce-scatter under sequence
// parallelism; the MoE all-to-alls overlapped with the shared expert when the engine overlaps them).
// Activation recompute adds the forward it reruns to B. The op list follows the modules of nn/:
// what a module runs, the model here charges.
#pragma once
#include <cstdint>
#include <string>

#include "megaton/models/stage_layout.h"
#include "megaton/plan/system.h"
#include "megaton/train/train_config.h"

namespace megaton::plan {

struct PhaseCost {
  double compute_s = 0;   // GEMMs and attention
  double memory_s = 0;    // memory-bound kernels
  double overhead_s = 0;  // fixed cost per kernel
  double comm_s = 0;      // tensor- / expert-parallel communication not hidden behind compute
  double flops = 0;       // FLOPs run (recompute included)
  double seconds() const { return compute_s + memory_s + overhead_s + comm_s; }
  PhaseCost& operator+=(const PhaseCost& o);
};
PhaseCost operator*(double k, PhaseCost c);

struct ChunkCost {
  PhaseCost forward, backward_input, backward_weight;
};

// Where the ranks of a group sit: `size` ranks `stride` apart in the global rank order (tp fastest,
// then dp, then pp; the expert groups inside each stage's tp x dp ranks).
struct GroupShape {
  int64_t size = 1, stride = 1;
};

// The link a group's collectives cross: within a node when the group's ranks fit in one.
const LinkSpec& group_link(const SystemSpec& s, GroupShape g);
double collective_seconds(const SystemSpec& s, Collective c, GroupShape g, double bytes);

// The process groups of c's layout (train::resolve_parallel_layout applied).
struct Groups {
  GroupShape tp, dp, pp, ep, edp;
};
Groups groups_of(const train::TrainConfig& c);

// The dtype name the system's tables use for c's compute precision ("f32", "bf16", "fp16").
std::string compute_dtype(const train::TrainConfig& c);

// One micro-batch through model chunk `model_chunk` of `layout` (train::pipeline_layout(c)).
ChunkCost chunk_cost(const train::TrainConfig& c, const SystemSpec& s, const models::StageLayout& layout,
                     int64_t model_chunk);

}  // namespace megaton::plan
