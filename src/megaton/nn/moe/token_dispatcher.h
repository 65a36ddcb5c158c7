// How a micro-batch's routed slots reach the routed experts and come back (Megatron-Core's token
// dispatchers), with expert parallelism: the E experts are split evenly over the expert-parallel
// group, rank r holding experts [r E/ep, (r+1) E/ep).
//
// - "alltoall" (MoEAlltoAllTokenDispatcher): the slots, permuted by expert on their own rank, travel
//   by one all-to-all with uneven splits to the ranks of their experts (the per-expert counts are
//   exchanged first), are sorted there from source-major to expert-major order for the grouped
//   GEMM, and go back the same way; unpermute then weighs them by their probs on the token's rank.
//   At ep 1 nothing travels: this is the single-process MoE layer.
// - "allgather" (MoEAllGatherTokenDispatcher): every rank gathers the group's tokens with their kept
//   slots and probs, runs its own experts on the slots that chose them, unpermutes into partial
//   outputs for all gathered tokens, and a reduce-scatter sums them back to each token's rank.
//
// Both keep the routing decisions (top-k and capacity drops) of the token's own rank, so a run at
// any ep is the run at ep 1 up to the order of floating-point sums. The shared expert (given as
// `overlap`) runs while the dispatch's tokens (F) and the combine's gradients (B) are in flight.
// One object per micro-batch: F calls dispatch then combine, B combine_backward then
// dispatch_backward; the rows in between are this rank's experts' inputs, expert-major.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "megaton/nn/tensor_parallel.h"

namespace megaton::nn {

// A micro-batch's routing on its own rank: indices / probs (f32) / pos [N, K] and the plan's rows
// per global expert (kernels/moe.h).
struct MoeRouting {
  Tensor indices, probs, pos;
  std::vector<int64_t> rows_per_expert;
};

class TokenDispatcher {
 public:
  virtual ~TokenDispatcher() = default;
  // x [N, C] -> the rows of this rank's experts [R, C], expert-major (rows_per_expert() per local
  // expert). `overlap` runs while the rows travel.
  virtual Tensor dispatch(const Tensor& x, const MoeRouting& routing, const std::function<void()>& overlap) = 0;
  // The experts' outputs [R, C] -> y [N, C], each token's slots weighted by their probs.
  virtual Tensor combine(const Tensor& expert_out) = 0;
  // dy [N, C] -> the gradient at the experts' outputs [R, C]; sets dprobs to the gradient at the
  // probs [N, K] (dy's dtype). `overlap` runs while the gradients travel.
  virtual Tensor combine_backward(const Tensor& dy, Tensor& dprobs, const std::function<void()>& overlap) = 0;
  // The gradient at the experts' inputs [R, C] -> dx [N, C] (the routed experts' part).
  virtual Tensor dispatch_backward(const Tensor& dexpert_in) = 0;
  const std::vector<int64_t>& rows_per_expert() const { return rows_per_expert_; }
  // Seconds blocked on this micro-batch's dispatcher communication (after any overlap), for the
  // benchmark's all-to-all fraction.
  double comm_seconds() const { return comm_seconds_; }

 protected:
  std::vector<int64_t> rows_per_expert_;  // per local expert
  double comm_seconds_ = 0.0;
};

// The dispatcher `type` names ("alltoall" | "allgather") over `ep` for E experts.
std::unique_ptr<TokenDispatcher> make_token_dispatcher(const std::string& type, const ExpertParallel& ep,
                                                       int64_t experts);
// The accepted dispatcher names, for config errors.
const std::vector<std::string>& token_dispatcher_types();

}  // namespace megaton::nn
