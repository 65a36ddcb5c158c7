// Megatron's DistributedDataParallel layout: every parameter's fp32 main weight and fp32 main
// gradient live in two flat buffers, and each Parameter's `value` / `grad` is a view into them.
//
// Parameters are laid out in reverse order of registration (= reverse order of use in forward),
// because backward finishes them in that order, and the buffer is cut into buckets of at least
// `bucket_size` elements. The routed experts' weights (ParallelGroup::Expert) never share a bucket
// with other parameters: their gradients are reduced over another group (Megatron keeps them in a
// buffer of their own for the same reason). During the last micro-batch of a step, a bucket is announced "ready"
// (the callback fires with its index) as soon as every gradient in it is final, which is when a
// data-parallel reduction of that bucket can start while backward goes on with earlier layers.
// The optimizer and the grad norm run over the flat buffers.
//
// Sharding (Megatron's distributed optimizer layout): with `shards` = S > 1 every bucket's size is
// padded to a multiple of kAlignElements x S, so bucket b splits into S equal, 64-byte-aligned,
// contiguous shards, and data-parallel rank r owns shard r of every bucket (it reduce-scatters
// the bucket's gradient into that shard, updates those weights and all-gathers them back). With
// S = 1 the layout is the plain DDP one (buckets padded to kAlignElements only). The routed
// experts' buckets split into their own count of shards (the expert-data-parallel group's size).
//
// A gradient is final when each module that uses the parameter (Parameter::uses) has called
// Parameter::grad_accumulated() once per micro-batch of the step. The buffer checks that every
// bucket fires exactly once per step and that no gradient is reported more often than that.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "megaton/nn/parameter.h"

namespace megaton::nn {

// A contiguous range of elements of the flat buffers.
struct ElementRange {
  int64_t offset = 0;
  int64_t numel = 0;
  int64_t end() const { return offset + numel; }
  bool operator==(const ElementRange&) const = default;
};
// The elements in both lists (each sorted by offset, without overlaps), sorted.
std::vector<ElementRange> intersect(const std::vector<ElementRange>& a, const std::vector<ElementRange>& b);

struct GradBucket {
  int64_t offset = 0;              // first element in the flat buffers
  int64_t numel = 0;               // elements, padding included
  std::vector<Parameter*> params;  // in buffer order
  bool expert = false;             // holds routed experts' weights (split over expert parallelism)
};

// Where the buffer puts its parameters, computed from their sizes alone (the planner's memory
// model lays out parameters it never builds with it): one slot per parameter in buffer order.
struct BufferSlot {
  int64_t numel = 0;
  bool expert = false;  // a routed expert's weight: never in a bucket with other parameters
};
struct BucketSpan {
  int64_t offset = 0, numel = 0;  // padding included
  bool expert = false;
  size_t first = 0, count = 0;    // its slots
};
struct BufferLayout {
  std::vector<int64_t> offsets;  // per slot
  std::vector<BucketSpan> buckets;
  int64_t total = 0;             // elements of each flat buffer
};
// The layout ParamAndGradBuffer(params, bucket_size, shards, expert_shards) makes (see there);
// expert_shards 0: shards.
BufferLayout lay_out_buffer(const std::vector<BufferSlot>& slots, int64_t bucket_size, int64_t shards,
                            int64_t expert_shards = 0);

class ParamAndGradBuffer {
 public:
  // Each parameter's start is aligned to kAlignElements (64 bytes of fp32), so every view is
  // aligned for vector loads; the gaps are zero in both buffers.
  static constexpr int64_t kAlignElements = 16;

  // Moves every parameter's value into the weight buffer (copying it), re-points value and grad at
  // views, zeroes the gradients and hooks each parameter's grad_accumulated(). bucket_size <= 0:
  // one bucket for everything. shards >= 1: every bucket's numel is a multiple of
  // kAlignElements x shards (see above); an expert bucket's of kAlignElements x expert_shards
  // (0: shards). The parameters must outlive the buffer.
  ParamAndGradBuffer(const ParameterList& params, int64_t bucket_size, int64_t shards = 1, int64_t expert_shards = 0);
  ~ParamAndGradBuffer();
  ParamAndGradBuffer(const ParamAndGradBuffer&) = delete;
  ParamAndGradBuffer& operator=(const ParamAndGradBuffer&) = delete;

  const Tensor& weights() const { return weights_; }  // [numel], MemCategory::Params
  const Tensor& grads() const { return grads_; }      // [numel], MemCategory::Grads
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  const ParameterList& params() const { return params_; }  // in buffer order
  int64_t offset_of(const Parameter& p) const;              // element offset of p's view
  int64_t shards() const { return shards_; }
  int64_t expert_shards() const { return expert_shards_; }
  // The number of shards bucket `bucket` splits into (expert_shards() for an expert bucket).
  int64_t shards_of(size_t bucket) const;
  // Shard `shard` of bucket `bucket`: numel / shards_of(bucket) elements from offset + shard x that.
  ElementRange shard_range(size_t bucket, int64_t shard) const;
  // The elements a rank owns: shard `shard` of every bucket (`expert_shard` of the expert buckets;
  // -1: `shard`), in buffer order (one per bucket).
  std::vector<ElementRange> shard_ranges(int64_t shard, int64_t expert_shard = -1) const;

  // Called with a bucket's index when its gradients are final (during the step's last micro-batch).
  void on_bucket_ready(std::function<void(size_t bucket)> callback) { ready_callback_ = std::move(callback); }
  // Zeroes the gradients and arms readiness tracking for a step of `microbatches` micro-batches.
  // track = false: zeroes only. A pipeline stage computes the gradients of its own layers alone, so
  // the others would never become final: no bucket fires and the step reduces after backward.
  void begin_step(int64_t microbatches, bool track = true);
  // Throws naming the first parameter whose gradient was not reported the expected number of times
  // (so its bucket never fired), then disarms tracking.
  void end_step();

 private:
  void report_index(size_t i);  // params_[i] finished one accumulation

  ParameterList params_;
  int64_t shards_ = 1, expert_shards_ = 1;
  Tensor weights_, grads_;
  std::vector<GradBucket> buckets_;
  std::vector<int64_t> offsets_;        // per params_ entry
  std::vector<size_t> bucket_of_;       // per params_ entry
  std::vector<int64_t> reports_left_;   // per params_ entry, during a step
  std::vector<int64_t> params_left_;    // per bucket, during a step (0: the bucket has fired)
  std::function<void(size_t)> ready_callback_;
  int64_t microbatches_ = 0;
  bool armed_ = false;
};

}  // namespace megaton::nn
