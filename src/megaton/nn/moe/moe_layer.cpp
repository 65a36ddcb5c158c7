#include "megaton/nn/moe/moe_layer.h"

#include <algorithm>
#include <cmath>

#include "megaton/kernels/activation.h"

namespace megaton::nn {

namespace {
const MoeConfig& validated(const MoeConfig& c) {
  c.validate();
  return c;
}
}  // namespace

MoeLayer::MoeLayer(const std::string& name, int64_t hidden, const MoeConfig& config)
    : router(name + ".router", hidden, validated(config).num_moe_experts, false, LinearParallel::Column),
      fc1(name + ".experts.linear_fc1.weight",
          {checked_mul("moe fc1 rows", config.num_moe_experts, 2 * config.moe_ffn_hidden_size), hidden}, true),
      fc2(name + ".experts.linear_fc2.weight",
          {checked_mul("moe fc2 rows", config.num_moe_experts, hidden), config.moe_ffn_hidden_size}, true),
      config_(config),
      hidden_(hidden),
      step_load_(static_cast<size_t>(config.num_moe_experts), 0) {
  if (config.moe_router_enable_expert_bias)
    expert_bias = Parameter(name + ".router.expert_bias", {config.num_moe_experts}, false);
  if (config.moe_shared_expert_intermediate_size > 0)
    shared.emplace(name + ".shared_experts", hidden, config.moe_shared_expert_intermediate_size, Activation::SwiGLU,
                   false);
}

Tensor MoeLayer::forward(SublayerCtx& c, const Tensor& x, int64_t B, int64_t T) {
  auto& ctx = ctx_as<MoeCtx>(c);
  const auto on = kernels::ExecContext::on(x);
  const int64_t N = rows_of(x), E = config_.num_moe_experts, K = config_.moe_router_topk;
  const int64_t F = config_.moe_ffn_hidden_size;
  if (N != B * T) fail("moe layer ", router.weight.name, ": ", N, " rows for a micro-batch of ", B, " x ", T, " tokens");

  // Router, in fp32 as Megatron's (the logits decide discrete choices).
  ctx.logits = router.forward(ctx.router_ctx, as_dtype(x, DType::F32));
  ctx.indices = new_activation({N, K}, router.weight.name + ".indices", DType::I32);
  ctx.probs = new_activation({N, K}, router.weight.name + ".probs");
  kernels::moe_route(on, ctx.indices, ctx.probs, ctx.logits, expert_bias.value, config_.router_options());

  stats_ = {};
  if (config_.moe_router_load_balancing_type != "none" && config_.moe_aux_loss_coeff > 0) {
    Tensor scores = new_activation({N, E}, router.weight.name + ".balance_scores");
    kernels::moe_balance_scores(on, scores, ctx.logits, config_.sigmoid());
    ctx.dbalance = new_activation({N, E}, router.weight.name + ".dbalance");
    const int64_t group_rows = config_.moe_router_load_balancing_type == "seq_aux_loss" ? T : N;
    stats_.balance_loss = kernels::moe_balance_loss(on, ctx.dbalance, scores, ctx.indices, group_rows,
                                                    config_.moe_aux_loss_coeff, aux_grad_scale_);
  }
  if (config_.moe_z_loss_coeff > 0)
    stats_.z_loss = kernels::moe_z_loss(on, Tensor{}, ctx.logits, config_.moe_z_loss_coeff, 0.0);

  // Dispatch: permute the token rows by expert, dropping over-capacity slots when a factor is set.
  const int64_t capacity =
      config_.moe_expert_capacity_factor > 0
          ? static_cast<int64_t>(std::ceil(config_.moe_expert_capacity_factor * static_cast<double>(N) *
                                           static_cast<double>(K) / static_cast<double>(E)))
          : -1;
  ctx.pos = new_activation({N, K}, router.weight.name + ".pos", DType::I32);
  ctx.plan = kernels::moe_dispatch_plan(on, ctx.pos, ctx.indices, ctx.probs, E, capacity,
                                        config_.moe_token_drop_policy == "position");
  stats_.dropped = ctx.plan.dropped;
  const auto& sel = ctx.plan.selected_per_expert;
  stats_.max_load = static_cast<double>(*std::max_element(sel.begin(), sel.end()));
  stats_.mean_load = static_cast<double>(N * K) / static_cast<double>(E);

  const int64_t M = ctx.plan.rows;
  const DType dt = x.dtype();
  ctx.xp = new_activation({M, hidden_}, fc1.name + ".input", dt);
  kernels::moe_permute(on, ctx.xp, x, ctx.pos);
  // Routed experts: one grouped GEMM per projection over the expert-contiguous rows.
  ctx.h = new_activation({M, 2 * F}, fc1.name + ".out", dt);
  kernels::grouped_linear_forward(on, ctx.h, ctx.xp, fc1.weight_in(dt), ctx.plan.rows_per_expert);
  ctx.a = new_activation({M, F}, fc1.name + ".act", dt);
  kernels::swiglu_forward(on, ctx.a, ctx.h);
  ctx.eo = new_activation({M, hidden_}, fc2.name + ".out", dt);
  kernels::grouped_linear_forward(on, ctx.eo, ctx.a, fc2.weight_in(dt), ctx.plan.rows_per_expert);
  if (recompute_act_) ctx.a = {};  // rebuilt by B
  Tensor y = new_activation({N, hidden_}, router.weight.name + ".moe_out", dt);
  kernels::moe_unpermute(on, y, ctx.eo, ctx.pos, as_dtype(ctx.probs, dt));

  ctx.stats = stats_;
  if (shared) {
    ctx.shared = shared->new_ctx();
    kernels::residual_forward(on, y, y, shared->forward(*ctx.shared, x, B, T));
  }
  return y;
}

Tensor MoeLayer::backward_input(SublayerCtx& c, const Tensor& dy, int64_t B, int64_t T) {
  auto& ctx = ctx_as<MoeCtx>(c);
  const auto on = kernels::ExecContext::on(dy);
  const int64_t N = rows_of(dy), E = config_.num_moe_experts, K = config_.moe_router_topk;
  const DType dt = dy.dtype();
  const auto& rows = ctx.plan.rows_per_expert;

  // Unpermute: gradients at the experts' outputs and at the routing probs.
  ctx.deo = new_activation(ctx.eo.shape(), fc2.name + ".dout", dt);
  Tensor dprobs = new_activation({N, K}, router.weight.name + ".dprobs", dt);
  kernels::moe_unpermute_backward(on, ctx.deo, dprobs, dy, ctx.eo, ctx.pos, as_dtype(ctx.probs, dt));
  ctx.eo = {};
  Tensor da = new_activation({ctx.h.size(0), ctx.h.size(1) / 2}, fc2.name + ".dinput", dt);  // a's shape
  kernels::grouped_linear_backward_input(on, da, ctx.deo, fc2.weight_in(dt), rows);
  ctx.dh = new_activation(ctx.h.shape(), fc1.name + ".dout", dt);
  kernels::swiglu_backward(on, ctx.dh, da, ctx.h);
  if (recompute_act_) {  // fc2's W needs its input again
    ctx.a = new_activation(da.shape(), fc1.name + ".act", dt);
    kernels::swiglu_forward(on, ctx.a, ctx.h);
  }
  ctx.h = {};
  Tensor dxp = new_activation(ctx.xp.shape(), fc1.name + ".dinput", dt);
  kernels::grouped_linear_backward_input(on, dxp, ctx.dh, fc1.weight_in(dt), rows);
  Tensor dx = new_activation({N, hidden_}, router.weight.name + ".dx", dt);
  kernels::moe_permute_backward(on, dx, dxp, ctx.pos);

  // Router: through the selected weights, plus the balancing and z losses' own gradients.
  Tensor dlogits = new_activation({N, E}, router.weight.name + ".dlogits");
  kernels::moe_route_backward(on, dlogits, as_dtype(dprobs, DType::F32), ctx.logits, ctx.indices,
                              config_.router_options());
  if (ctx.dbalance.defined()) {
    kernels::moe_balance_scores_backward(on, dlogits, ctx.dbalance, ctx.logits, config_.sigmoid());
    ctx.dbalance = {};
  }
  if (config_.moe_z_loss_coeff > 0) kernels::moe_z_loss(on, dlogits, ctx.logits, config_.moe_z_loss_coeff, aux_grad_scale_);
  kernels::residual_forward(on, dx, dx, as_dtype(router.backward_input(ctx.router_ctx, dlogits), dt));
  ctx.logits = ctx.probs = ctx.indices = {};

  if (shared) kernels::residual_forward(on, dx, dx, shared->backward_input(*ctx.shared, dy, B, T));
  // Only trained micro-batches (the ones that run backward) count towards the step's statistics
  // and the bias update.
  for (int64_t e = 0; e < E; ++e) step_load_[static_cast<size_t>(e)] += ctx.plan.selected_per_expert[static_cast<size_t>(e)];
  step_sums_.balance_loss += ctx.stats.balance_loss;
  step_sums_.z_loss += ctx.stats.z_loss;
  step_sums_.dropped += ctx.stats.dropped;
  ++step_microbatches_;
  return dx;
}

void MoeLayer::backward_weight(SublayerCtx& c) {
  auto& ctx = ctx_as<MoeCtx>(c);
  const auto on = kernels::ExecContext::on(fc1.grad);
  const auto& rows = ctx.plan.rows_per_expert;
  if (shared) shared->backward_weight(*ctx.shared);
  kernels::grouped_linear_backward_weight(on, fc2.grad, ctx.deo, ctx.a, rows);
  fc2.grad_accumulated();
  kernels::grouped_linear_backward_weight(on, fc1.grad, ctx.dh, ctx.xp, rows);
  fc1.grad_accumulated();
  router.backward_weight(ctx.router_ctx);
  // The bias has no gradient (it only steers selection); its (zero) gradient is final now.
  if (expert_bias.value.defined()) expert_bias.grad_accumulated();
  ctx = MoeCtx{};
}

void MoeLayer::begin_step() {
  std::fill(step_load_.begin(), step_load_.end(), 0);
  step_sums_ = {};
  step_microbatches_ = 0;
}

MoeStats MoeLayer::step_stats() const {
  MoeStats s = step_sums_;
  if (step_microbatches_ == 0) return s;
  s.balance_loss /= static_cast<double>(step_microbatches_);
  s.z_loss /= static_cast<double>(step_microbatches_);
  int64_t total = 0;
  for (int64_t l : step_load_) total += l;
  s.max_load = static_cast<double>(*std::max_element(step_load_.begin(), step_load_.end()));
  s.mean_load = static_cast<double>(total) / static_cast<double>(step_load_.size());
  return s;
}

void MoeLayer::update_expert_bias(const std::vector<parallel::Communicator*>& groups) {
  if (!expert_bias.value.defined()) return;
  const auto E = static_cast<int64_t>(step_load_.size());
  // Counts in f64: exact far beyond any step's token count, and summed exactly over the group.
  Tensor load = Tensor::empty({E}, DType::F64, MemCategory::Workspace, expert_bias.name + ".load");
  double* l = load.data<double>();
  for (int64_t e = 0; e < E; ++e) l[e] = static_cast<double>(step_load_[static_cast<size_t>(e)]);
  for (parallel::Communicator* g : groups)
    if (g->size() > 1) g->all_reduce(load);
  double total = 0.0;
  for (int64_t e = 0; e < E; ++e) total += l[e];
  const double mean = total / static_cast<double>(E);
  float* b = expert_bias.value.data<float>();
  const auto rate = static_cast<float>(config_.moe_router_bias_update_rate);
  for (int64_t e = 0; e < E; ++e) {
    const double load = l[e];
    b[e] += load < mean ? rate : load > mean ? -rate : 0.0f;
  }
}

void MoeLayer::parameters(ParameterList& out) {
  router.parameters(out);
  if (expert_bias.value.defined()) out.push_back(&expert_bias);
  out.insert(out.end(), {&fc1, &fc2});
  if (shared) shared->parameters(out);
}

void MoeLayer::gemm_weights(ParameterList& out) {
  out.insert(out.end(), {&fc1, &fc2});
  if (shared) shared->gemm_weights(out);
}

}  // namespace megaton::nn
