// A trainable parameter as Megatron keeps it: an fp32 main weight and an fp32 main gradient
// accumulator (both views into the flat ParamAndGradBuffer once the model is wrapped in one), an
// optional copy of the weight in the compute dtype (bf16 mixed precision: what the GEMMs read,
// refreshed from the main weight after it changes), the weight-decay flag, and how the parameter
// is sharded across a parallel group.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "megaton/core/tensor.h"

namespace megaton::kernels {
struct QuantizedWeight;
}

namespace megaton::nn {

// Which process group a parameter is split over: Tensor (tensor-model-parallel), Expert (the routed
// experts over expert-model-parallel ranks) or none.
enum class ParallelGroup : uint8_t { None, Tensor, Expert };

// A run of indices [start, start + length) of a parameter's global tensor along its partition dim.
struct ShardPiece {
  int64_t start = 0, length = 0;
  bool operator==(const ShardPiece&) const = default;
};

// How a parameter's global (layout-free) tensor is cut into the per-rank shards, as Megatron's
// ColumnParallelLinear (weight and bias along dim 0, output features), RowParallelLinear (weight
// along dim 1, input features; bias replicated), the vocab-parallel embedding and head (dim 0):
// rank r's local tensor is pieces[r] taken along partition_dim and concatenated in order. Most
// splits give each rank one piece; SwiGLU's fused [gate | up] gives two (its share of each), and
// GQA with fewer kv heads than ranks gives several ranks the same k / v piece (replicated kv
// heads). Indices at or past global_size are padding (the vocabulary padded to a multiple of
// make_vocab_size_divisible_by x tp): never part of the global tensor, zero when sliced in.
// Replicated parameters (partition_dim -1) are whole on every rank; partial_grad marks those whose
// gradient each rank computes from its own rows only (norms under sequence parallelism): summed
// over the group after backward. Optimizers, checkpoints and the planner read this instead of
// knowing each model.
struct ShardSpec {
  int partition_dim = -1;
  ParallelGroup group = ParallelGroup::None;
  int64_t global_size = 0;                      // the global tensor's extent along partition_dim
  int rank = 0;                                 // this process's rank in `group`
  std::vector<std::vector<ShardPiece>> pieces;  // per rank of the group
  bool partial_grad = false;

  bool replicated() const { return partition_dim < 0; }
  const std::vector<ShardPiece>& mine() const { return pieces.at(static_cast<size_t>(rank)); }
  static ShardSpec replicate(bool partial_grad = false) {
    ShardSpec s;
    s.partial_grad = partial_grad;
    return s;
  }
  // Split along `dim` of a global extent `global_size` into the given pieces per rank.
  static ShardSpec tensor_parallel(int dim, int64_t global_size, int rank, std::vector<std::vector<ShardPiece>> pieces) {
    return {dim, ParallelGroup::Tensor, global_size, rank, std::move(pieces), false};
  }
};

// A switch that is on on this thread while any Tag scope is open there (scopes nest).
template <typename Tag>
class ThreadScope {
 public:
  ThreadScope() { ++depth_; }
  ~ThreadScope() { --depth_; }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;
  static bool active() { return depth_ > 0; }

 private:
  static inline thread_local int depth_ = 0;
};

// While one is open on this thread, new Parameters get no gradient (grad stays undefined): a model
// built to serve, whose fp32 gradients would double its memory and its start-up. Nothing may run
// backward on such a model.
class NoGradients : public ThreadScope<NoGradients> {};

// While one is open on this thread, new Parameters' main weights are allocated but neither cleared nor
// touched (their pages stay unbacked): for a loader that then writes every element or replaces the
// tensor with a view of a mapped file (models/hf_format.cpp).
class UnclearedValues : public ThreadScope<UnclearedValues> {};

struct Parameter {
  std::string name;           // Megatron-style name, e.g. "decoder.layers.0.self_attention.linear_qkv.weight"
  // fp32 main weight, MemCategory::Params. A model built only to serve (models/hf_format.h) may hold a
  // weight in bf16 alone (value is then its own compute copy) or as 8-bit codes alone (value is then
  // quantized->codes): read f32_values where any weight may come.
  Tensor value;
  Tensor grad;                // fp32 main grad, MemCategory::Grads, same shape, accumulated by backward-W
  Tensor compute;             // the weight in the compute dtype (bf16), or undefined: see refresh_compute_copies
  bool weight_decay = true;   // false for norms, biases and embeddings by default
  // Bumped by refresh_compute_copies, i.e. whenever the main weight may have changed: copies derived
  // from it outside `compute` (FP8 weights) compare it to know when to remake themselves.
  uint64_t version = 0;
  // Inference only: the weight as 8-bit codes with block scales (kernels/quantized_linear.h), which a
  // Linear or the output head then reads instead of `value` / `compute`; such a layer cannot train.
  std::shared_ptr<const kernels::QuantizedWeight> quantized;
  ShardSpec shard;
  // Modules that accumulate into `grad` per micro-batch: 2 for a word embedding tied to the output
  // head. The gradient buffer waits for all of them before it calls this gradient final.
  int uses = 1;
  // Set by the gradient buffer; called through grad_accumulated().
  std::function<void(Parameter&)> grad_hook;

  Parameter() = default;
  // value zeroed (unless an UnclearedValues scope is open); grad zeroed too, unless a NoGradients
  // scope is open on this thread.
  Parameter(std::string n, Shape shape, bool decay, ShardSpec shard_spec = {});
  // The weight a kernel computing in `dtype` reads: the compute copy when there is one in that
  // dtype, else the main weight (a kernel then names any dtype mismatch).
  const Tensor& weight_in(DType dtype) const { return compute.defined() && compute.dtype() == dtype ? compute : value; }
  // Backward-W calls this right after it has added one micro-batch's gradient to `grad`.
  void grad_accumulated() {
    if (grad_hook) grad_hook(*this);
  }
};

using ParameterList = std::vector<Parameter*>;

void zero_grads(const ParameterList& params);
// Gives p a compute copy in `dtype` (MemCategory::Params) holding its main weight rounded to dtype.
void add_compute_copy(Parameter& p, DType dtype);
// Re-rounds every compute copy from its main weight and bumps every version: after init, a load or
// an optimizer step, and before the next forward.
void refresh_compute_copies(const ParameterList& params);
int64_t count_parameters(const ParameterList& params);
// p's weight in f32, for code that reads it once (MLA's absorbed products, a quantiser): the main weight
// itself, else a bf16-only value widened, else the dequantised codes of a weight held as its codes
// alone (a model built to serve: models/hf_format.h).
Tensor f32_values(const Parameter& p);

}  // namespace megaton::nn
