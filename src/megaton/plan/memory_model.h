// The planner's memory model: the bytes one training process holds per allocator category
// (core/allocator.h), predicted from a TrainConfig alone. No model is built and no tensor
// allocated, so a 671B configuration is sized in microseconds.
//
// Static memory follows what the trainer constructs: this rank's parameters in registration order,
// laid out as nn::ParamAndGradBuffer lays them (64-byte aligned starts, buckets, distributed-optimizer
// padding and shards, expert buckets apart), the compute copies the GEMMs read, AdamW's moments (or
// the distributed optimizer's owned shard), FP8 weight caches, and the host snapshots checkpointing
// and rewind keep for good.
//
// Activations come from a replay of one micro-batch through shadows of the modules of nn/ and
// models/: every tensor a forward, backward-input or backward-weight allocates, in the engine's
// order, freed where the engine drops its last reference, counted per category. It follows the CPU
// engine: 16-bit GEMMs copy their operands to f32 workspace when this host runs them on OpenBLAS
// (kernels::cpu::gemm_library), and FP8 linears are taken calibrated (under delayed scaling the
// first step still runs in the compute dtype; from the second on, as modelled). Not modelled:
// a router's imbalance under expert parallelism (the dispatched rows are taken balanced), and
// buffers of finished collectives that the MPI progress thread has not let go of yet.
#pragma once
#include <cstdint>
#include <vector>

#include "megaton/core/allocator.h"
#include "megaton/pipeline/simulator.h"
#include "megaton/train/train_config.h"

namespace megaton::plan {

struct MemoryBreakdown {  // bytes
  double params = 0, grads = 0, optimizer = 0, activations = 0, workspace = 0, other = 0;
  // The sum of the categories (for a peak: an upper bound of the allocator's total peak, which the
  // categories reach at different moments).
  double total() const;
  double& at(MemCategory c);
  double at(MemCategory c) const;
  MemoryBreakdown& operator+=(const MemoryBreakdown& o);
};
MemoryBreakdown operator+(MemoryBreakdown a, const MemoryBreakdown& b);
MemoryBreakdown operator-(MemoryBreakdown a, const MemoryBreakdown& b);
MemoryBreakdown operator*(double k, MemoryBreakdown m);
// Category by category, the larger of the two.
MemoryBreakdown max(const MemoryBreakdown& a, const MemoryBreakdown& b);

// The persistent state of the process at pipeline rank pp_rank (0..pp-1), tensor-parallel rank
// tp_rank and expert-parallel rank ep_rank under c (train::resolve_parallel_layout applied): fp32
// main weights in the flat buffer, compute copies (bf16 / fp16) of the weights GEMMs read, the
// FP8 weight caches of FP8 linears, the fp32 gradient buffer, AdamW's moments (the distributed
// optimizer's owned shards only), optimizer post-validation's undo copies, the checkpoint / rewind
// snapshots (their weight copies count as other), and the rotary tables (workspace). Every split
// Megaton makes is even, so the ranks of a stage hold the same bytes; the ranks are checked.
MemoryBreakdown static_memory(const train::TrainConfig& c, int64_t pp_rank, int64_t tp_rank = 0, int64_t ep_rank = 0);

// One micro-batch through model chunk `model_chunk` (layer order, 0 .. pp x chunks per rank - 1; see
// train::pipeline_layout) under c's recompute settings: `saved` = the bytes its contexts keep from
// the chunk's forward until its backward frees them (its input included; on the last chunk the loss's
// gradient too: the head never defers its weight gradient, and multi-token prediction runs its
// forward and backward inside the loss op); `forward_transient` / `backward_transient` = the peak
// above `saved` while the chunk's forward (with the loss op on the last chunk) / backward with B and
// W in one call runs, its output, incoming gradient and workspace included. For the schedules that
// defer W, also B and W apart: `input_transient` = the peak above `saved` during B alone,
// `held_for_w` = what the chunk keeps from its B until its W (the inputs and output gradients of its
// linears), `weight_transient` = the peak above that during W (zero for the other schedules).
struct ChunkActivations {
  MemoryBreakdown saved, forward_transient, backward_transient;
  MemoryBreakdown input_transient, held_for_w, weight_transient;
};
ChunkActivations chunk_activations(const train::TrainConfig& c, int64_t model_chunk, int64_t tp_rank = 0);

// The allocator's peak per category of the process at pipeline rank pp_rank: static + the largest,
// over the rank's compute parts (`live`, from pipeline::simulate), of what the other micro-batch
// chunks hold then (saved x the largest saved chunk of this rank, held_for_w x its largest
// held_for_w, each with a micro-batch's targets) + what the part itself holds at its peak; plus what
// the step allocates beside the modules: the pipeline sends it keeps until the step ends and a receive
// posted one op ahead (`in_flight`: the simulator's activation peak), the distributed optimizer's
// staging, the FP8 amax and expert-load reductions, collectives' scalars. What train's first-step
// `peak_memory_mb` record reports (MB = 1e6 bytes). Exact without pipelining and under 1F1B. Where W
// is deferred the sends are still counted as at a 1F1B peak (gpt-tiny zb-h1's last stage: one
// boundary tensor short); with interleaved chunks of different sizes the largest stands for each.
MemoryBreakdown peak_memory(const train::TrainConfig& c, int64_t pp_rank, int64_t in_flight,
                            const std::vector<pipeline::LiveActivations>& live, int64_t tp_rank = 0,
                            int64_t ep_rank = 0);

// The same with `in_flight` micro-batch chunks saved at the peak, during a forward or a backward
// with its W (1 without pipelining; the simulator's activation peak under 1F1B).
MemoryBreakdown peak_memory(const train::TrainConfig& c, int64_t pp_rank, int64_t in_flight, int64_t tp_rank = 0,
                            int64_t ep_rank = 0);

}  // namespace megaton::plan
