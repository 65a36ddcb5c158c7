// `megaton plan calibrate`: measures this machine with the engine's own kernels and communicator
// and returns a planner system (plan/system.h, source = "calibrated"). Measured times become
// efficiencies through plan/op_counts.h's FLOP and byte counts, the ones the cost model turns them
// back into times with, so a counting convention cancels out between the two.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "megaton/parallel/communicator.h"
#include "megaton/plan/collective_bench.h"
#include "megaton/plan/system.h"

namespace megaton::plan {

struct CalibrateOptions {
  int threads = 0;       // per device (= per rank); 0: the process's setting (OMP_NUM_THREADS, else every core)
  double budget_s = 60;  // rough total time of calibrate_device and calibrate_network together
  std::vector<std::string> dtypes = {"f32", "bf16"};  // GEMM dtypes: f32 (required: attention's), bf16, fp16
  bool quick = false;                                 // a few small points only, for tests
};

// Measures this process's device: the CPU cores of `threads` threads (restored afterwards).
// - [[gemm]] per dtype: kernels::linear_forward (cpu/gemm.h's dispatch, as training runs it) over
//   square shapes and a grid of m = 128..16384 tokens by n, k = 8..8192, cheapest first, as many
//   as the budget allows, each on cold operands (cold_operand_copies).
// - [[attention]] (f32 only, the kernel's dtype: bf16 training runs it on an f32 copy): the flash
//   attention kernels forward and backward at seq 128..4096, head_dim 16..128, one head per thread,
//   on cold operands.
// - peak_flops: per dtype the best rate a measured kernel reached (for f32 the attention kernels
//   count too): the machine's measured ceiling, not a datasheet figure, so every efficiency is at
//   most 1 and one of them is 1.
// - [memory.efficiency] of each MemoryOp: the engine's kernels in f32 (norm: layer- and RMSNorm,
//   backward = input + weight gradients; activation: GeLU and SwiGLU; elementwise: the residual
//   add; embedding; cross-entropy; RoPE; optimizer: an AdamW step over a flat buffer), op_counts.h's
//   bytes over time x bandwidth; bandwidth_Bps: the best rate measured, of a STREAM copy, triad or
//   in-place update or of one of those kernels, so again every efficiency is at most 1.
// - op_overhead_s: the mean best call of two tiny kernels (a 2-row GEMM, a 1 x 1 LayerNorm): the
//   fixed cost of every op (call, checks, thread fork / join).
// memory_bytes is this machine's, devices_per_node 1, and both links the fallback of a world of
// one (see calibrate_network). Every figure is the median of repeated calls: the planner
// predicts typical steps, so it needs the typical speed of each kernel, not the luckiest one's.
SystemSpec calibrate_device(const CalibrateOptions& options);

// Measures the links between the ranks of `world`, all on this machine: collectives and
// send / recv from 4 KB to 64 MB (fewer when quick), fitted by fit_link (collective_bench.h) to
// collective_time (plan/collective_cost.h: the cost model's formula). Sets intra_node; inter_node
// is a copy of it (not measured: one node, said in the description); devices_per_node = the
// world's ranks and memory_bytes this machine's memory shared among them. Every rank must call
// it. A world of one measures no link and keeps calibrate_device's fallback (a memory copy's
// bandwidth, efficiency 0.5, latency 2 us), which the description then states.
void calibrate_network(SystemSpec& s, parallel::Communicator& world, const CalibrateOptions& options);

// A compute kernel's operands as a training step hands them over are out of the core's caches: the
// ops between two calls pass more than their size through it. So each timed call of a GEMM or an
// attention kernel takes the next of this many copies of its operands (`bytes_per_copy` each),
// enough to span `cold_bytes` (kColdOperandBytes; a quick calibration spans less). Measured on a Xeon with 2 MiB of L2
// a core: gpt-tiny's GEMMs (e.g. 1024 x 768 x 192) reached 127-133 GFLOP/s on the same operands call after call,
// 101-107 cycling through 64 MiB or 1 GiB of copies, and 102-132 inside training steps; the warm figures predicted
// steps 17% short.
constexpr double kColdOperandBytes = 64.0 * (1 << 20);
int64_t cold_operand_copies(double bytes_per_copy, double cold_bytes = kColdOperandBytes);

// A few lines for people: peak per dtype, memory bandwidth and efficiencies, op overhead, links.
std::string calibration_summary(const SystemSpec& s);

}  // namespace megaton::plan
