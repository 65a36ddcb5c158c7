// The "moe" MLP kind (Megatron-Core's MoELayer): a router picks k of E routed experts per token,
// the token dispatcher permutes the tokens' rows so each expert's tokens are contiguous, the routed
// experts (SwiGLU MLPs) run as one grouped GEMM per projection over those rows, and unpermute sums
// each token's expert outputs weighted by its routing probs; an optional shared expert (a dense
// SwiGLU MLP) sees every token and is added. The load-balancing and z losses do not enter the
// model's loss: as Megatron's MoEAuxLossAutoScaler, their gradient is added to the router logits'
// during B (scaled like the main loss, see set_aux_loss_grad_scale) and their values reported in
// stats(). Single process: no tensor or expert parallelism yet (a tensor-parallel spec is refused).
#pragma once
#include <optional>

#include "megaton/kernels/moe.h"
#include "megaton/nn/mlp.h"
#include "megaton/nn/moe/moe_config.h"

namespace megaton::nn {

// Routing statistics of a forward, or summed over the micro-batches of a training step, for the
// metrics.
struct MoeStats {
  double balance_loss = 0.0;  // the load-balancing (aux / seq aux) loss, coefficient included (step: mean)
  double z_loss = 0.0;        // (step: mean)
  int64_t dropped = 0;        // slots dropped by the capacity factor
  double max_load = 0.0, mean_load = 0.0;  // slots that selected an expert: max and mean over experts
};

struct MoeCtx : SublayerCtx {
  LinearCtx router_ctx;
  Tensor logits;         // [N, E] f32
  Tensor indices, probs;  // [N, K]: selected experts and their weights
  Tensor dbalance;       // [N, E]: the balancing loss's gradient at its scores (scaled), or undefined
  Tensor pos;            // [N, K]: permuted row of every slot (-1: dropped)
  kernels::DispatchPlan plan;
  Tensor xp, h, a, eo;   // permuted input, fc1 output [gate | up], SwiGLU output, fc2 output
  Tensor dh, deo;        // saved by B for W: the fc1 and fc2 output gradients
  std::unique_ptr<SublayerCtx> shared;
  MoeStats stats;        // this micro-batch's, counted into the step's by B
};

class MoeLayer final : public MlpLayer {
 public:
  MoeLayer(const std::string& name, int64_t hidden, const MoeConfig& config);
  std::unique_ptr<SublayerCtx> new_ctx() const override { return std::make_unique<MoeCtx>(); }
  // x [N, hidden] with N = B*T tokens; T groups the rows into sequences for the sequence-wise loss.
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
  Parameter fc1;              // [E * 2F, hidden]: each expert's [gate | up]
  Parameter fc2;              // [E * hidden, F]
  std::optional<Mlp> shared;  // the shared expert

 private:
  MoeConfig config_;
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
