#include "megaton/nn/mla_attention.h"

#include "megaton/kernels/activation.h"
#include "megaton/kernels/attention.h"
#include "megaton/kernels/copy.h"
#include "megaton/parallel/tensor_parallel_mappings.h"

namespace megaton::nn {

namespace {
using kernels::ExecContext;

// t [rows, cols] seen as [1, rows * heads, cols / heads]: one head per row, so that a column block
// of every head is one copy_rows block.
Tensor per_head(const Tensor& t, int64_t heads) { return t.view({1, rows_of(t) * heads, t.size(-1) / heads}); }

int64_t local_heads(const std::string& name, int64_t heads, const TensorParallel& tp) {
  if (heads % tp.size() != 0)
    fail("attention '", name, "': num_attention_heads ", heads, " is not divisible by tensor_model_parallel_size ",
         tp.size());
  return heads / tp.size();
}
}  // namespace

MultiLatentAttention::MultiLatentAttention(const std::string& name, int64_t hidden, int64_t heads,
                                           const MlaConfig& config, bool bias, double norm_eps,
                                           const RopeTables* rope, double softmax_scale, const TensorParallel& tp)
    : kv_down(name + ".linear_kv_down_proj", hidden, config.kv_lora_rank + config.qk_pos_emb_head_dim, bias,
              LinearParallel::Column),
      kv_norm(name + ".kv_layernorm", config.kv_lora_rank, Normalization::RMSNorm, norm_eps, tp.splits_sequence()),
      kv_up(name + ".linear_kv_up_proj", config.kv_lora_rank, heads * (config.qk_head_dim + config.v_head_dim), bias,
            LinearParallel::Column, tp),
      proj(name + ".linear_proj", heads * config.v_head_dim, hidden, bias, LinearParallel::Row, tp),
      config_(config),
      hidden_(hidden),
      heads_(local_heads(name, heads, tp)),
      tp_(tp),
      rope_(rope),
      scale_(softmax_scale) {
  config.validate();
  if (!rope) fail("attention '", name, "': multi-latent attention needs rotary embeddings (position_embedding_type rope)");
  if (rope->cos.size(-1) * 2 != config.qk_pos_emb_head_dim)
    fail("attention '", name, "': rotary tables of head dim ", rope->cos.size(-1) * 2, ", qk_pos_emb_head_dim is ",
         config.qk_pos_emb_head_dim);
  const int64_t q_out = heads * config.qk_dim();
  if (config.q_lora_rank > 0) {
    q_down = std::make_unique<Linear>(name + ".linear_q_down_proj", hidden, config.q_lora_rank, bias,
                                      LinearParallel::Column);
    q_norm = std::make_unique<Norm>(name + ".q_layernorm", config.q_lora_rank, Normalization::RMSNorm, norm_eps,
                                    tp.splits_sequence());
    q_up = std::make_unique<Linear>(name + ".linear_q_up_proj", config.q_lora_rank, q_out, bias,
                                    LinearParallel::Column, tp);
  } else {
    q_proj = std::make_unique<Linear>(name + ".linear_q_proj", hidden, q_out, bias, LinearParallel::Column, tp);
  }
  // Under sequence parallelism the replicated down-projections see this rank's rows only: their
  // weight gradients are parts, summed over the group after backward (as the norms').
  std::vector<Linear*> downs{&kv_down};
  if (q_down) downs.push_back(q_down.get());
  for (Linear* l : downs)
    for (Parameter* p : {&l->weight, &l->bias})
      if (p->value.defined()) p->shard = ShardSpec::replicate(tp.splits_sequence());
}

void MultiLatentAttention::rotate(const Tensor& t, int64_t B, int64_t T, int64_t heads, int64_t width, int64_t at,
                                  int64_t pos_offset, bool inverse) const {
  const int64_t r = config_.qk_pos_emb_head_dim;
  if (pos_offset + T > rope_->cos.size(0))
    fail("attention '", proj.weight.name, "': position ", pos_offset + T, " beyond the ", rope_->cos.size(0),
         " positions of the rotary tables (max_position_embeddings)");
  const Tensor rope_parts = t.window(at, {t.numel() - at}, t.name());
  kernels::rope_apply(ExecContext::on(t), rope_parts, rope_->cos, rope_->sin, B, T, heads, 1, r,
                      {heads * width, width}, pos_offset, rope_->layout, inverse);
}

Tensor MultiLatentAttention::query_input(MlaCtx& ctx, const Tensor& x) {
  return q_proj ? x : q_norm->forward(ctx.q_norm_ctx, q_down->forward(ctx.q_down_ctx, x));
}

Tensor MultiLatentAttention::query(MlaCtx& ctx, const Tensor& x) {
  return (q_proj ? *q_proj : *q_up).forward(ctx.q_up_ctx, query_input(ctx, x));
}

Tensor MultiLatentAttention::query_backward(MlaCtx& ctx, const Tensor& dq) {
  if (q_proj) return q_proj->backward_input(ctx.q_up_ctx, dq);
  const Tensor dlatent = q_norm->backward_input(ctx.q_norm_ctx, q_up->backward_input(ctx.q_up_ctx, dq));
  return q_down->backward_input(ctx.q_down_ctx, dlatent);
}

Tensor MultiLatentAttention::expand_keys(const Tensor& kv_up_out, const Tensor& rope_keys, int64_t rope_col) const {
  const int64_t N = rows_of(kv_up_out), nope = config_.qk_head_dim, v = config_.v_head_dim;
  const int64_t qk = config_.qk_dim(), r = config_.qk_pos_emb_head_dim, W = rope_keys.size(-1);
  Tensor kv = new_activation({N, heads_ * (qk + v)}, proj.weight.name + ".keys_values");
  const Tensor up = as_dtype(kv_up_out, DType::F32), rope = as_dtype(rope_keys, DType::F32);
  const auto on = ExecContext::on(kv);
  const Tensor kv_heads = per_head(kv, heads_), up_heads = per_head(up, heads_);
  kernels::copy_rows(on, {kv_heads, 0, 0}, {up_heads, 0, 0}, N * heads_, nope);   // k_nope
  kernels::copy_rows(on, {kv_heads, 0, qk}, {up_heads, 0, nope}, N * heads_, v);  // v
  kernels::broadcast_rows(on, {kv.view({N, heads_, qk + v}), 0, nope}, {rope.view({N, 1, W}), 0, rope_col}, heads_, r);
  return kv;
}

Tensor MultiLatentAttention::core_forward(MlaCtx& ctx, int64_t B, int64_t T) const {
  const int64_t qk = config_.qk_dim(), v = config_.v_head_dim;
  Tensor out = new_activation({B * T, heads_ * v}, proj.weight.name + ".attn_out");
  ctx.lse = new_activation({B, heads_, T}, proj.weight.name + ".lse");
  kernels::attention_forward(ExecContext::on(ctx.q), out, ctx.lse, ctx.q, {ctx.kv, 0}, {ctx.kv, qk}, B, T, heads_,
                             heads_, kernels::HeadDim{qk, v}, {heads_ * qk, qk}, {heads_ * (qk + v), qk + v}, scale_);
  return out;
}

Tensor MultiLatentAttention::forward(SublayerCtx& c, const Tensor& x, int64_t B, int64_t T) {
  auto& ctx = ctx_as<MlaCtx>(c);
  // x holds this rank's rows under sequence parallelism: the latents are computed for them, the
  // column-parallel up-projections gather the rows, and the rope keys are gathered with the latent.
  const int64_t N = rows_of(x), R = config_.kv_lora_rank, r = config_.qk_pos_emb_head_dim;
  // f32 queries: an f32 q_x is rotated in place (no module keeps a linear's output), bf16 converted.
  ctx.q = as_dtype(query(ctx, x), DType::F32);
  rotate(ctx.q, B, T, heads_, config_.qk_dim(), config_.qk_head_dim, 0, false);
  const Tensor kv_latent = kv_down.forward(ctx.kv_down_ctx, x);  // [N, R + r]: [c | k_rope]
  Tensor latent = new_activation({N, R}, kv_down.weight.name + ".latent", x.dtype());
  kernels::copy_rows(ExecContext::on(x), {latent.view({1, N, R}), 0, 0}, {kv_latent.view({1, N, R + r}), 0, 0}, N, R);
  const Tensor kv_up_out = kv_up.forward(ctx.kv_up_ctx, kv_norm.forward(ctx.kv_norm_ctx, latent));
  if (tp_.splits_sequence()) {  // every token's rope key, gathered alone (the latent's rows came with kv_up)
    Tensor rope = new_activation({N, r}, kv_down.weight.name + ".rope_keys", x.dtype());
    kernels::copy_rows(ExecContext::on(x), {rope.view({1, N, r}), 0, 0}, {kv_latent.view({1, N, R + r}), 0, R}, N, r);
    ctx.kv = expand_keys(kv_up_out, parallel::gather_rows(*tp_.group, rope, rope.name()), 0);
  } else {
    ctx.kv = expand_keys(kv_up_out, kv_latent, R);
  }
  rotate(ctx.kv, B, T, heads_, config_.qk_dim() + config_.v_head_dim, config_.qk_head_dim, 0, false);
  ctx.out = as_dtype(core_forward(ctx, B, T), x.dtype());
  return project_attention_output(proj, ctx.proj_ctx, ctx.out, ctx.lse, recompute_core_);
}

Tensor MultiLatentAttention::backward_input(SublayerCtx& c, const Tensor& dy, int64_t B, int64_t T) {
  auto& ctx = ctx_as<MlaCtx>(c);
  // Nf: every token of the micro-batch (the heads' rows); N: this rank's (the latents' rows), fewer
  // under sequence parallelism.
  const int64_t Nf = B * T, N = rows_of(dy), nope = config_.qk_head_dim, v = config_.v_head_dim;
  const int64_t qk = config_.qk_dim(), R = config_.kv_lora_rank, r = config_.qk_pos_emb_head_dim;
  const Tensor dout = as_dtype(proj.backward_input(ctx.proj_ctx, dy), DType::F32);
  if (!ctx.out.defined()) {  // core_attn recompute: the same kernel on the same q, k, v
    ctx.out = as_dtype(core_forward(ctx, B, T), dy.dtype());
    if (!ctx.proj_ctx.x_fp8) ctx.proj_ctx.x = ctx.out;
  }
  const auto on = ExecContext::on(dout);
  Tensor dq = new_activation({Nf, heads_ * qk}, proj.weight.name + ".dq");
  Tensor dkv = new_activation({Nf, heads_ * (qk + v)}, proj.weight.name + ".dkv");
  kernels::attention_backward(on, dq, {dkv, 0}, {dkv, qk}, dout, as_dtype(ctx.out, DType::F32), ctx.lse, ctx.q,
                              {ctx.kv, 0}, {ctx.kv, qk}, B, T, heads_, heads_, kernels::HeadDim{qk, v},
                              {heads_ * qk, qk}, {heads_ * (qk + v), qk + v}, scale_);
  ctx.q = {};
  ctx.kv = {};
  ctx.out = {};
  ctx.lse = {};
  // The rotation is orthogonal (times YaRN's magnitude): its backward is the inverse-angle rotation.
  rotate(dq, B, T, heads_, qk, nope, 0, true);
  rotate(dkv, B, T, heads_, qk + v, nope, 0, true);
  // The up-projection's output gradient, per head [dk_nope | dv]; the shared rope key's, summed over heads.
  Tensor dup = new_activation({Nf, heads_ * (nope + v)}, kv_up.weight.name + ".dout");
  const Tensor dup_heads = per_head(dup, heads_), dkv_heads = per_head(dkv, heads_);
  kernels::copy_rows(on, {dup_heads, 0, 0}, {dkv_heads, 0, 0}, Nf * heads_, nope);
  kernels::copy_rows(on, {dup_heads, 0, nope}, {dkv_heads, 0, qk}, Nf * heads_, v);
  const Tensor dlatent_n = kv_up.backward_input(ctx.kv_up_ctx, as_dtype(dup, dy.dtype()));
  const Tensor dlatent = as_dtype(kv_norm.backward_input(ctx.kv_norm_ctx, dlatent_n), DType::F32);
  // The shared rope key's gradient: the sum over the heads, which under tensor parallelism are split
  // (the latent's came all-reduced, or reduce-scattered to this rank's rows, out of the column-
  // parallel up-projection; the rope key's goes the same way).
  Tensor drope = new_activation({Nf, r}, kv_down.weight.name + ".drope");
  kernels::sum_rows(on, {drope.view({Nf, 1, r}), 0, 0}, {dkv.view({Nf, heads_, qk + v}), 0, nope}, heads_, r);
  if (tp_.splits_sequence()) drope = parallel::reduce_scatter_rows(*tp_.group, drope, drope.name());
  else if (tp_.active()) parallel::reduce_from_region(*tp_.group, drope);
  Tensor dkv_latent = new_activation({N, R + r}, kv_down.weight.name + ".dout");
  kernels::copy_rows(on, {dkv_latent.view({1, N, R + r}), 0, 0}, {dlatent.view({1, N, R}), 0, 0}, N, R);
  kernels::copy_rows(on, {dkv_latent.view({1, N, R + r}), 0, R}, {drope.view({1, N, r}), 0, 0}, N, r);
  Tensor dx = kv_down.backward_input(ctx.kv_down_ctx, as_dtype(dkv_latent, dy.dtype()));
  const Tensor dx_q = query_backward(ctx, as_dtype(dq, dy.dtype()));
  kernels::residual_forward(ExecContext::on(dx), dx, dx, dx_q);
  return dx;
}

void MultiLatentAttention::backward_weight(SublayerCtx& c) {
  auto& ctx = ctx_as<MlaCtx>(c);
  proj.backward_weight(ctx.proj_ctx);
  kv_up.backward_weight(ctx.kv_up_ctx);
  kv_norm.backward_weight(ctx.kv_norm_ctx);
  kv_down.backward_weight(ctx.kv_down_ctx);
  if (q_proj) {
    q_proj->backward_weight(ctx.q_up_ctx);
    return;
  }
  q_up->backward_weight(ctx.q_up_ctx);
  q_norm->backward_weight(ctx.q_norm_ctx);
  q_down->backward_weight(ctx.q_down_ctx);
}

void MultiLatentAttention::parameters(ParameterList& out) {
  if (q_proj) {
    q_proj->parameters(out);
  } else {
    q_down->parameters(out);
    q_norm->parameters(out);
    q_up->parameters(out);
  }
  kv_down.parameters(out);
  kv_norm.parameters(out);
  kv_up.parameters(out);
  proj.parameters(out);
}

void MultiLatentAttention::gemm_weights(ParameterList& out) {
  std::vector<Linear*> all;
  linears(all);
  for (Linear* l : all) out.push_back(&l->weight);
}

void MultiLatentAttention::linears(std::vector<Linear*>& out) {
  if (q_proj) out.push_back(q_proj.get());
  else out.insert(out.end(), {q_down.get(), q_up.get()});
  out.insert(out.end(), {&kv_down, &kv_up, &proj});
}

}  // namespace megaton::nn
