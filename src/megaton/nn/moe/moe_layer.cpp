#include "megaton/nn/moe/moe_layer.h"

#include <algorithm>
#include <cmath>

#include "megaton/core/checked.h"
#include "megaton/kernels/activation.h"
#include "megaton/parallel/tensor_parallel_mappings.h"

namespace megaton::nn {

namespace {
const MoeConfig& validated(const MoeConfig& c, const ExpertParallel& ep) {
  c.validate();
  if (c.num_moe_experts % ep.size() != 0)
    fail("num_moe_experts ", c.num_moe_experts, " is not divisible by expert_model_parallel_size ", ep.size(),
         " (each expert-parallel rank holds the same number of experts)");
  return c;
}

// The routed experts' weights [E x rows_per_expert, cols] split by whole experts over ep.
ShardSpec expert_split(int64_t experts, int64_t rows_per_expert, const ExpertParallel& ep) {
  ShardSpec s;
  s.partition_dim = 0;
  s.group = ParallelGroup::Expert;
  s.global_size = checked_mul("moe expert rows", experts, rows_per_expert);
  s.rank = ep.rank();
  const int64_t each = s.global_size / ep.size();
  for (int r = 0; r < ep.size(); ++r) s.pieces.push_back({{r * each, each}});
  return s;
}
}  // namespace

MoeLayer::MoeLayer(const std::string& name, int64_t hidden, const MoeConfig& config, const ExpertParallel& ep,
                   const TensorParallel& tp)
    : router(name + ".router", hidden, validated(config, ep).num_moe_experts, false, LinearParallel::Column),
      fc1(name + ".experts.linear_fc1.weight",
          {config.num_moe_experts / ep.size() * 2 * config.moe_ffn_hidden_size, hidden}, true,
          expert_split(config.num_moe_experts, 2 * config.moe_ffn_hidden_size, ep)),
      fc2(name + ".experts.linear_fc2.weight", {config.num_moe_experts / ep.size() * hidden, config.moe_ffn_hidden_size},
          true, expert_split(config.num_moe_experts, hidden, ep)),
      config_(config),
      ep_(ep),
      tp_(tp),
      hidden_(hidden),
      step_load_(static_cast<size_t>(config.num_moe_experts), 0) {
  make_token_dispatcher(config.moe_token_dispatcher_type, ep, config.num_moe_experts);  // names a wrong type now
  if (config.moe_router_enable_expert_bias)
    expert_bias = Parameter(name + ".router.expert_bias", {config.num_moe_experts}, false);
  if (config.moe_shared_expert_intermediate_size > 0)
    shared.emplace(name + ".shared_experts", hidden, config.moe_shared_expert_intermediate_size, Activation::SwiGLU,
                   false, tp);
}

Tensor MoeLayer::my_rows(const Tensor& all, const std::string& name) const {
  return tp_.active() ? parallel::scatter_rows(*tp_.group, all, name) : all;
}

Tensor MoeLayer::all_rows(const Tensor& mine, const std::string& name) const {
  return tp_.active() ? parallel::gather_rows(*tp_.group, mine, name) : mine;
}

Tensor MoeLayer::forward(SublayerCtx& c, const Tensor& x, int64_t B, int64_t T) {
  auto& ctx = ctx_as<MoeCtx>(c);
  const auto on = kernels::ExecContext::on(x);
  const bool sp = tp_.splits_sequence();
  const int64_t N = rows_of(x) * (sp ? tp_.size() : 1), E = config_.num_moe_experts, K = config_.moe_router_topk;
  if (N != B * T) fail("moe layer ", router.weight.name, ": ", N, " rows for a micro-batch of ", B, " x ", T, " tokens");
  if (N % tp_.size() != 0)
    fail("moe layer ", router.weight.name, ": a micro-batch of ", N, " tokens does not split over ", tp_.size(),
         " tensor-parallel ranks");
  // Every token routed on every tensor-parallel rank (the router is small next to the experts);
  // this rank's block of them goes to the experts.
  const Tensor x_all = sp ? all_rows(x, router.weight.name + ".x") : x;
  const Tensor x_mine = sp ? x : my_rows(x, router.weight.name + ".x_mine");

  // Router, in fp32 as Megatron's (the logits decide discrete choices).
  ctx.logits = router.forward(ctx.router_ctx, as_dtype(x_all, DType::F32));
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

  // The plan on this rank, over all E experts: which slots capacity drops, and where the kept ones go
  // when permuted by expert (the dispatcher moves them to their experts' ranks from there).
  const int64_t capacity =
      config_.moe_expert_capacity_factor > 0
          ? static_cast<int64_t>(std::ceil(config_.moe_expert_capacity_factor * static_cast<double>(N) *
                                           static_cast<double>(K) / static_cast<double>(E)))
          : -1;
  ctx.pos = new_activation({N, K}, router.weight.name + ".pos", DType::I32);
  const kernels::DispatchPlan plan = kernels::moe_dispatch_plan(on, ctx.pos, ctx.indices, ctx.probs, E, capacity,
                                                                config_.moe_token_drop_policy == "position");
  ctx.selected_per_expert = plan.selected_per_expert;
  stats_.dropped = plan.dropped;
  const auto& sel = plan.selected_per_expert;
  stats_.max_load = static_cast<double>(*std::max_element(sel.begin(), sel.end()));
  stats_.mean_load = static_cast<double>(N * K) / static_cast<double>(E);

  // The shared expert sees every token; it runs while the routed tokens travel.
  Tensor shared_out;
  const auto run_shared = [&] {
    if (!shared) return;
    ctx.shared = shared->new_ctx();
    shared_out = shared->forward(*ctx.shared, x, B, T);
  };
  const bool overlap = config_.moe_shared_expert_overlap;
  if (!overlap) run_shared();
  MoeRouting routing{ctx.indices, ctx.probs, ctx.pos, plan.rows_per_expert};
  if (tp_.active()) {  // this rank's block of the kept slots, permuted by expert among themselves
    Tensor kept = new_activation({N, K}, router.weight.name + ".kept", DType::I32);
    kernels::moe_kept_experts(on, kept, ctx.indices, ctx.pos);
    routing.indices = my_rows(kept, router.weight.name + ".kept_mine");
    routing.probs = my_rows(ctx.probs, router.weight.name + ".probs_mine");
    routing.pos = new_activation({N / tp_.size(), K}, router.weight.name + ".pos_mine", DType::I32);
    routing.rows_per_expert = kernels::moe_local_plan(on, routing.pos, routing.indices, 0, E).rows_per_expert;
  }
  ctx.dispatcher = make_token_dispatcher(config_.moe_token_dispatcher_type, ep_, E);
  const Tensor xs =
      ctx.dispatcher->dispatch(x_mine, routing, overlap ? std::function<void()>(run_shared) : [] {});
  Tensor y = ctx.dispatcher->combine(experts_forward(ctx, xs));
  if (!sp) y = all_rows(y, router.weight.name + ".routed_out");
  ctx.stats = stats_;
  if (shared) kernels::residual_forward(on, y, y, shared_out);
  return y;
}

// Routed experts: one grouped GEMM per projection over this rank's experts' expert-major rows.
Tensor MoeLayer::experts_forward(MoeCtx& ctx, const Tensor& xs) {
  const auto on = kernels::ExecContext::on(xs);
  const auto& rows = ctx.dispatcher->rows_per_expert();
  const bool grouped = config_.moe_grouped_gemm;
  const int64_t M = rows_of(xs), F = config_.moe_ffn_hidden_size;
  const DType dt = xs.dtype();
  ctx.xs = xs;
  ctx.h = new_activation({M, 2 * F}, fc1.name + ".out", dt);
  kernels::grouped_linear_forward(on, ctx.h, xs, fc1.weight_in(dt), rows, grouped);
  ctx.a = new_activation({M, F}, fc1.name + ".act", dt);
  kernels::swiglu_forward(on, ctx.a, ctx.h);
  Tensor eo = new_activation({M, hidden_}, fc2.name + ".out", dt);
  kernels::grouped_linear_forward(on, eo, ctx.a, fc2.weight_in(dt), rows, grouped);
  if (recompute_act_) ctx.a = {};  // rebuilt by B
  return eo;
}

Tensor MoeLayer::experts_backward_input(MoeCtx& ctx, const Tensor& deo) {
  const auto on = kernels::ExecContext::on(deo);
  const auto& rows = ctx.dispatcher->rows_per_expert();
  const bool grouped = config_.moe_grouped_gemm;
  const DType dt = deo.dtype();
  ctx.deo = deo;
  Tensor da = new_activation({ctx.h.size(0), ctx.h.size(1) / 2}, fc2.name + ".dinput", dt);  // a's shape
  kernels::grouped_linear_backward_input(on, da, deo, fc2.weight_in(dt), rows, grouped);
  ctx.dh = new_activation(ctx.h.shape(), fc1.name + ".dout", dt);
  kernels::swiglu_backward(on, ctx.dh, da, ctx.h);
  if (recompute_act_) {  // fc2's W needs its input again
    ctx.a = new_activation(da.shape(), fc1.name + ".act", dt);
    kernels::swiglu_forward(on, ctx.a, ctx.h);
  }
  ctx.h = {};
  Tensor dxs = new_activation(ctx.xs.shape(), fc1.name + ".dinput", dt);
  kernels::grouped_linear_backward_input(on, dxs, ctx.dh, fc1.weight_in(dt), rows, grouped);
  return dxs;
}

Tensor MoeLayer::backward_input(SublayerCtx& c, const Tensor& dy, int64_t B, int64_t T) {
  auto& ctx = ctx_as<MoeCtx>(c);
  const auto on = kernels::ExecContext::on(dy);
  const bool sp = tp_.splits_sequence();
  const int64_t N = rows_of(ctx.logits), E = config_.num_moe_experts;
  const DType dt = dy.dtype();

  // The shared expert's input gradient is computed while the routed gradients travel; it is added last.
  Tensor dx_shared;
  const auto run_shared = [&] {
    if (shared) dx_shared = shared->backward_input(*ctx.shared, dy, B, T);
  };
  const bool overlap = config_.moe_shared_expert_overlap;
  if (!overlap) run_shared();
  // Combine's backward: gradients at the experts' outputs and at the routing probs.
  Tensor dprobs;
  const Tensor dy_mine = sp ? dy : my_rows(dy, router.weight.name + ".dy_mine");
  const Tensor deo =
      ctx.dispatcher->combine_backward(dy_mine, dprobs, overlap ? std::function<void()>(run_shared) : [] {});
  Tensor dx = ctx.dispatcher->dispatch_backward(experts_backward_input(ctx, deo));
  if (!sp) dx = all_rows(dx, router.weight.name + ".routed_dx");
  dprobs = all_rows(dprobs, router.weight.name + ".dprobs");  // every token's, for the router

  // Router: through the selected weights, plus the balancing and z losses' own gradients.
  Tensor dlogits = new_activation({N, E}, router.weight.name + ".dlogits");
  kernels::moe_route_backward(on, dlogits, as_dtype(dprobs, DType::F32), ctx.logits, ctx.indices,
                              config_.router_options());
  if (ctx.dbalance.defined()) {
    kernels::moe_balance_scores_backward(on, dlogits, ctx.dbalance, ctx.logits, config_.sigmoid());
    ctx.dbalance = {};
  }
  if (config_.moe_z_loss_coeff > 0) kernels::moe_z_loss(on, dlogits, ctx.logits, config_.moe_z_loss_coeff, aux_grad_scale_);
  const Tensor dx_router = router.backward_input(ctx.router_ctx, dlogits);
  kernels::residual_forward(on, dx, dx, as_dtype(sp ? my_rows(dx_router, dx_router.name()) : dx_router, dt));
  ctx.logits = ctx.probs = ctx.indices = ctx.pos = {};

  if (shared) kernels::residual_forward(on, dx, dx, dx_shared);
  // Only trained micro-batches (the ones that run backward) count towards the step's statistics
  // and the bias update.
  for (int64_t e = 0; e < E; ++e) step_load_[static_cast<size_t>(e)] += ctx.selected_per_expert[static_cast<size_t>(e)];
  step_sums_.balance_loss += ctx.stats.balance_loss;
  step_sums_.z_loss += ctx.stats.z_loss;
  step_sums_.dropped += ctx.stats.dropped;
  step_sums_.comm_seconds += ctx.dispatcher->comm_seconds();
  ++step_microbatches_;
  return dx;
}

void MoeLayer::backward_weight(SublayerCtx& c) {
  auto& ctx = ctx_as<MoeCtx>(c);
  const auto on = kernels::ExecContext::on(fc1.grad);
  const auto& rows = ctx.dispatcher->rows_per_expert();
  const bool grouped = config_.moe_grouped_gemm;
  if (shared) shared->backward_weight(*ctx.shared);
  kernels::grouped_linear_backward_weight(on, fc2.grad, ctx.deo, ctx.a, rows, grouped);
  fc2.grad_accumulated();
  kernels::grouped_linear_backward_weight(on, fc1.grad, ctx.dh, ctx.xs, rows, grouped);
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
