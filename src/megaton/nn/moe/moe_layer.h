// The "moe" MLP kind (Megatron-Core's MoELayer): a router picks k of E routed experts per token,
// the token dispatcher permutes the tokens' rows so each expert's tokens are contiguous, the routed
// experts (SwiGLU MLPs) run as one grouped GEMM per projection over those rows, and unpermute sums
// each token's expert outputs weighted by its routing probs; an optional shared expert (a dense
// SwiGLU MLP) sees every token and is added. The load-balancing and z losses do not enter the
// model's loss: as Megatron's MoEAuxLossAutoScaler, their gradient is added to the router logits'
// during B (scaled like the main loss, see set_aux_loss_grad_scale) and their values reported in
// stats(). Expert parallelism (ExpertParallel): each rank of the group holds E / ep routed experts
// (fc1 / fc2 split by whole experts, ParallelGroup::Expert) and the token dispatcher
// (token_dispatcher.h, moe_token_dispatcher_type) moves the slots to them and back; the router is
// replicated. Tensor parallelism (expert tensor parallel size 1, as DeepSeek-V3 trains): the shared
// expert is a tensor-parallel Mlp; the router runs on every token of the micro-batch on each
// tensor-parallel rank (gathered under sequence parallelism), so routing, capacity drops and the
// balancing losses are the single-process ones, and each rank sends only its block of the token
// rows (its sequence-parallel rows) to the routed experts, whose expert-parallel group may span the
// tensor-parallel ranks (parallel/process_groups.h). The blocks' outputs are gathered back (without
// sequence parallelism) and the probs' gradients gathered for the router's backward.
#pragma once
#include <optional>

#include "megaton/kernels/moe.h"
#include "megaton/nn/mlp.h"
#include "megaton/nn/moe/moe_config.h"
#include "megaton/nn/moe/token_dispatcher.h"

namespace megaton::nn {

// Routing statistics of a forward, or summed over the micro-batches of a training step, for the
// metrics.
struct MoeStats {
  double balance_loss = 0.0;  // the load-balancing (aux / seq aux) loss, coefficient included (step: mean)
  double z_loss = 0.0;        // (step: mean)
  int64_t dropped = 0;        // slots dropped by the capacity factor
  double max_load = 0.0, mean_load = 0.0;  // slots that selected an expert: max and mean over experts
  double comm_seconds = 0.0;  // blocked on the token dispatcher's communication (step: sum)
};

struct MoeCtx : SublayerCtx {
  LinearCtx router_ctx;
  Tensor logits;         // [N, E] f32
  Tensor indices, probs;  // [N, K]: selected experts and their weights
  Tensor dbalance;       // [N, E]: the balancing loss's gradient at its scores (scaled), or undefined
  Tensor pos;            // [N, K]: every slot's row when permuted by expert (-1: dropped)
  std::vector<int64_t> selected_per_expert;  // this rank's slots that chose each of the E experts
  std::unique_ptr<TokenDispatcher> dispatcher;
  Tensor xs, h, a;       // this rank's experts' input rows (expert-major), fc1 output [gate | up], SwiGLU output
  Tensor dh, deo;        // saved by B for W: the fc1 and fc2 output gradients
  std::unique_ptr<SublayerCtx> shared;
  MoeStats stats;        // this micro-batch's, counted into the step's by B
};

class MoeLayer final : public MlpLayer {
 public:
  MoeLayer(const std::string& name, int64_t hidden, const MoeConfig& config, const ExpertParallel& ep = {},
           const TensorParallel& tp = {});
  std::unique_ptr<SublayerCtx> new_ctx() const override { return std::make_unique<MoeCtx>(); }
  // x [N, hidden] with N = B*T tokens (B*T / tp: this rank's rows under sequence parallelism); T
  // groups the rows into sequences for the sequence-wise loss.
  Tensor forward(SublayerCtx& ctx, const Tensor& x, int64_t B, int64_t T) override;
  Tensor backward_input(SublayerCtx& ctx, const Tensor& dy, int64_t B, int64_t T) override;
  void backward_weight(SublayerCtx& ctx) override;
  void parameters(ParameterList& out) override;
  void gemm_weights(ParameterList& out) override;
  // FP8 candidates: the shared expert's linears. The router stays fp32 (as in TE); the routed
  // experts' grouped GEMMs have no FP8 path yet and run in the compute dtype.
  void linears(std::vector<Linear*>& out) override {
    if (shared) shared->linears(out);
  }

  // The factor the balancing and z losses' gradients are multiplied by: the main loss's gradient
  // scale (1 / (micro-batches x data-parallel size)), set by the training step.
  void set_aux_loss_grad_scale(double s) { aux_grad_scale_ = s; }
  // Starts a training step: forgets the loads and statistics of the micro-batches trained before.
  void begin_step();
  // Selective recompute's "moe_act": the SwiGLU output is dropped after F and rebuilt from fc1's
  // output at the end of B (for fc2's W), bitwise the one F made.
  void set_recompute_act(bool on) { recompute_act_ = on; }
  // This process's statistics over the micro-batches trained (the ones that ran B) since begin_step.
  MoeStats step_stats() const;
  // Auxiliary-loss-free balancing, after each optimizer step: bias_e += rate * sign(mean - load_e)
  // over the slots each expert was selected by in the micro-batches trained since begin_step,
  // summed over `groups` (none: this process): the data-parallel group, so every replica moves its
  // bias alike, and the pipeline group, whose ranks that do not run this layer add zeros and so keep
  // the bias of the rank that does. No-op without moe_router_enable_expert_bias.
  void update_expert_bias(const std::vector<parallel::Communicator*>& groups);
  // The latest forward's statistics (training or not).
  const MoeStats& stats() const { return stats_; }
  const MoeConfig& config() const { return config_; }

  Linear router;              // [E, hidden], fp32, no bias
  Parameter expert_bias;      // [E], undefined without moe_router_enable_expert_bias; never trained by the optimizer
  Parameter fc1;              // [E/ep * 2F, hidden]: each local expert's [gate | up]
  Parameter fc2;              // [E/ep * hidden, F]
  std::optional<Mlp> shared;  // the shared expert

 private:
  // The routed experts on this rank's rows (expert-major, the dispatcher's rows per local expert);
  // the backward saves what W reads.
  Tensor experts_forward(MoeCtx& ctx, const Tensor& xs);
  Tensor experts_backward_input(MoeCtx& ctx, const Tensor& deo);
  // This rank's block of the rows of a tensor of the micro-batch's N rows (itself without tensor
  // parallelism), and the inverse: every rank's blocks gathered.
  Tensor my_rows(const Tensor& all, const std::string& name) const;
  Tensor all_rows(const Tensor& mine, const std::string& name) const;

  MoeConfig config_;
  ExpertParallel ep_;
  TensorParallel tp_;
  int64_t hidden_;
  double aux_grad_scale_ = 1.0;
  bool recompute_act_ = false;
  MoeStats stats_;
  // Over the micro-batches trained since begin_step: slots per expert, and the sums of their stats.
  std::vector<int64_t> step_load_;
  MoeStats step_sums_;
  int64_t step_microbatches_ = 0;
};

}  // namespace megaton::nn
