#include "megaton/nn/transformer_block.h"

#include "megaton/kernels/activation.h"
#include "megaton/nn/moe/moe_layer.h"

namespace megaton::nn {

TransformerBlock::TransformerBlock(const std::string& name, const BlockSpec& s, const RopeTables* rope)
    : spec(s),
      input_norm(name + ".input_layernorm", s.attn.hidden, s.norm, s.norm_eps, s.tp.splits_sequence()),
      attention(make_attention(name + ".self_attention", s, rope)),
      pre_mlp_norm(name + ".pre_mlp_layernorm", s.attn.hidden, s.norm, s.norm_eps, s.tp.splits_sequence()),
      mlp(make_mlp(name + ".mlp", s)),
      name_(name) {}

namespace {
// a += b, returning a. `a` is always a fresh branch output (or input gradient) that no context
// keeps, so the residual sum reuses its storage instead of allocating another tensor.
Tensor add_into(Tensor a, const Tensor& b) {
  kernels::residual_forward(kernels::ExecContext::on(a), a, a, b);
  return a;
}

SublayerCtx& existing(const std::unique_ptr<SublayerCtx>& ctx, const char* op) {
  MEGATON_CHECK(ctx != nullptr, op, " on a block context without a forward");
  return *ctx;
}

// Selective "layernorm" recompute after a sublayer's forward: drops the sublayer's kept input when
// it is the norm's output itself (not a gathered or 8-bit copy, which the norm cannot rebuild).
bool drop_norm_output(Sublayer& sublayer, SublayerCtx& ctx, const Tensor& norm_out) {
  Tensor* kept = sublayer.kept_input(ctx);
  if (!kept || !kept->defined() || kept->raw() != norm_out.raw()) return false;
  *kept = {};
  return true;
}

// Before the sublayer's B: the norm's output again, from the input its context saved.
void rebuild_norm_output(Norm& norm, const NormCtx& saved, Sublayer& sublayer, SublayerCtx& ctx) {
  NormCtx scratch;  // the saved statistics stay as they are for the norm's own backward
  *sublayer.kept_input(ctx) = norm.forward(scratch, saved.x);
}
}  // namespace

FusedInput TransformerBlock::add_then_norm(Norm& norm, NormCtx& ctx, const Tensor& h, const Tensor& x) const {
  if (fuse_residual_norm_) return norm.fused_input(ctx, h, x);
  return norm.fused_input(ctx, add_into(h, x));
}

Tensor TransformerBlock::forward_normed(Sublayer& sublayer, SublayerCtx& ctx, FusedInput& normed, int64_t B,
                                        int64_t T) const {
  return fuse_norm_linear_ ? sublayer.forward_fused(ctx, normed, B, T) : sublayer.forward(ctx, normed.written(), B, T);
}

Tensor TransformerBlock::norm_backward_add(Norm& norm, NormCtx& ctx, const Tensor& dnorm,
                                           const Tensor& dresidual) const {
  if (fuse_residual_norm_) return norm.backward_input(ctx, dnorm, dresidual);
  return add_into(norm.backward_input(ctx, dnorm), dresidual);
}

Tensor TransformerBlock::forward(BlockCtx& ctx, const Tensor& x, int64_t B, int64_t T) {
  ctx.attn = attention->new_ctx();
  ctx.mlp = mlp->new_ctx();
  FusedInput n1 = input_norm.fused_input(ctx.norm1, x);
  const Tensor h = forward_normed(*attention, *ctx.attn, n1, B, T);  // + x below, in its storage
  if (recompute_norm_) ctx.norm1_out_dropped = drop_norm_output(*attention, *ctx.attn, n1.output());
  FusedInput n2 = add_then_norm(pre_mlp_norm, ctx.norm2, h, x);
  // Recomputing the MLP keeps its input, so the norm's output is written for it.
  Tensor m = recompute_mlp_ ? mlp->forward(*ctx.mlp, n2.written(), B, T) : forward_normed(*mlp, *ctx.mlp, n2, B, T);
  if (recompute_mlp_) {  // rebuilt by backward_input from its input
    ctx.mlp_input = n2.output();
    ctx.mlp.reset();
  } else if (recompute_norm_) {
    ctx.norm2_out_dropped = drop_norm_output(*mlp, *ctx.mlp, n2.output());
  }
  return add_into(m, h);
}

Tensor TransformerBlock::backward_input(BlockCtx& ctx, const Tensor& dy, int64_t B, int64_t T) {
  if (ctx.mlp_input.defined()) {
    ctx.mlp = mlp->new_ctx();
    (void)mlp->forward(*ctx.mlp, ctx.mlp_input, B, T);
    ctx.mlp_input = {};
  }
  if (ctx.norm2_out_dropped) rebuild_norm_output(pre_mlp_norm, ctx.norm2, *mlp, existing(ctx.mlp, "backward_input"));
  if (ctx.norm1_out_dropped) rebuild_norm_output(input_norm, ctx.norm1, *attention, existing(ctx.attn, "backward_input"));
  ctx.norm1_out_dropped = ctx.norm2_out_dropped = false;
  // dy flows into both the residual and the MLP branch; dh = dy + dMLP/dh.
  const Tensor dh =
      norm_backward_add(pre_mlp_norm, ctx.norm2, mlp->backward_input(existing(ctx.mlp, "backward_input"), dy, B, T), dy);
  return norm_backward_add(input_norm, ctx.norm1,
                           attention->backward_input(existing(ctx.attn, "backward_input"), dh, B, T), dh);
}

void TransformerBlock::backward_weight(BlockCtx& ctx) {
  mlp->backward_weight(existing(ctx.mlp, "backward_weight"));
  pre_mlp_norm.backward_weight(ctx.norm2);
  attention->backward_weight(existing(ctx.attn, "backward_weight"));
  input_norm.backward_weight(ctx.norm1);
  ctx.attn.reset();
  ctx.mlp.reset();
}

Tensor TransformerBlock::forward_cached(KVCache& cache, const Tensor& x, int64_t B, int64_t T) {
  NormCtx n1, n2;
  auto m = mlp->new_ctx();
  const Tensor h = attention->forward_cached(cache, input_norm.forward(n1, x), B, T);  // + x, in its storage
  return add_into(mlp->forward(*m, add_then_norm(pre_mlp_norm, n2, h, x).written(), B, T), h);
}

Tensor TransformerBlock::forward_paged(PagedKVCache::Layer& layer, const PagedBatch& batch, const Tensor& x) {
  NormCtx n1, n2;
  auto m = mlp->new_ctx();
  const Tensor h = attention->forward_paged(layer, batch, input_norm.forward(n1, x));  // + x, in its storage
  const auto S = static_cast<int64_t>(batch.seqs.size());
  return add_into(mlp->forward(*m, add_then_norm(pre_mlp_norm, n2, h, x).written(), S, batch.tokens), h);
}

void TransformerBlock::set_recompute(const RecomputeConfig& config) {
  const bool selective = config.granularity == RecomputeGranularity::Selective;
  recompute_mlp_ = selective && config.mlp;
  recompute_norm_ = selective && config.layernorm;
  attention->set_recompute_core(selective && config.core_attn);
  if (auto* moe = dynamic_cast<MoeLayer*>(mlp.get())) moe->set_recompute_act(selective && config.moe_act);
}

void TransformerBlock::set_fusion(const FusionConfig& config) {
  fuse_residual_norm_ = config.residual_norm;
  fuse_norm_linear_ = config.layernorm_linear;
  auto* moe = dynamic_cast<MoeLayer*>(mlp.get());
  for (Mlp* dense : {dynamic_cast<Mlp*>(mlp.get()), moe && moe->shared ? &*moe->shared : nullptr})
    if (dense) {
      dense->set_bias_activation_fusion(config.bias_activation);
      dense->set_activation_cast_fusion(config.layernorm_mlp);
    }
}

void TransformerBlock::parameters(ParameterList& out) {
  input_norm.parameters(out);
  attention->parameters(out);
  pre_mlp_norm.parameters(out);
  mlp->parameters(out);
}

void TransformerBlock::linears(std::vector<Linear*>& out) {
  attention->linears(out);
  mlp->linears(out);
}

void TransformerBlock::gemm_weights(ParameterList& out) {
  attention->gemm_weights(out);
  mlp->gemm_weights(out);
}

SelfAttention& TransformerBlock::self_attention() {
  auto* a = dynamic_cast<SelfAttention*>(attention.get());
  if (!a) fail("layer ", name_, " has attention kind '", spec.attention, "', not self_attention");
  return *a;
}

MultiLatentAttention& TransformerBlock::latent_attention() {
  auto* a = dynamic_cast<MultiLatentAttention*>(attention.get());
  if (!a) fail("layer ", name_, " has attention kind '", spec.attention, "', not mla");
  return *a;
}

Mlp& TransformerBlock::dense_mlp() {
  auto* m = dynamic_cast<Mlp*>(mlp.get());
  if (!m) fail("layer ", name_, " has mlp kind '", spec.mlp, "', not dense");
  return *m;
}

}  // namespace megaton::nn
