#include "megaton/nn/mtp_layer.h"

#include "megaton/kernels/copy.h"

namespace megaton::nn {

MtpLayer::MtpLayer(const std::string& name, const BlockSpec& spec, const RopeTables* rope)
    : enorm(name + ".enorm", spec.attn.hidden, spec.norm, spec.norm_eps),
      hnorm(name + ".hnorm", spec.attn.hidden, spec.norm, spec.norm_eps),
      eh_proj(name + ".eh_proj", 2 * spec.attn.hidden, spec.attn.hidden, false, LinearParallel::Column),
      block(name + ".transformer_layer", spec, rope),
      final_norm(name + ".final_layernorm", spec.attn.hidden, spec.norm, spec.norm_eps),
      hidden_(spec.attn.hidden) {
  // Under tensor parallelism its input (the final norm's output) and eh_proj are replicated, the block
  // splits as any layer does; with sequence parallelism the rows would be split: not wired.
  if (spec.tp.splits_sequence()) fail("multi-token prediction does not support sequence_parallel yet (", name, ")");
}

Tensor MtpLayer::combine(MtpCtx* ctx, const Tensor& emb, const Tensor& hidden) {
  MtpCtx scratch;
  MtpCtx& c = ctx ? *ctx : scratch;
  const int64_t N = rows_of(emb), C = hidden_;
  const Tensor e = enorm.forward(c.enorm, emb), h = hnorm.forward(c.hnorm, hidden);
  Tensor joined = new_activation({N, 2 * C}, eh_proj.weight.name + ".input", emb.dtype());
  const auto on = kernels::ExecContext::on(joined);
  kernels::copy_rows(on, {joined.view({1, N, 2 * C}), 0, 0}, {e.view({1, N, C}), 0, 0}, N, C);
  kernels::copy_rows(on, {joined.view({1, N, 2 * C}), 0, C}, {h.view({1, N, C}), 0, 0}, N, C);
  return eh_proj.forward(c.eh_proj, joined);
}

Tensor MtpLayer::forward(MtpCtx& ctx, const Tensor& emb, const Tensor& hidden, int64_t B, int64_t T) {
  const Tensor x = combine(&ctx, emb, hidden);
  return final_norm.forward(ctx.final_norm, block.forward(ctx.block, x, B, T));
}

std::pair<Tensor, Tensor> MtpLayer::backward(MtpCtx& ctx, const Tensor& dout, int64_t B, int64_t T) {
  const int64_t N = rows_of(dout), C = hidden_;
  const Tensor dblock = final_norm.backward_input(ctx.final_norm, dout);
  final_norm.backward_weight(ctx.final_norm);
  const Tensor dx = block.backward_input(ctx.block, dblock, B, T);
  block.backward_weight(ctx.block);
  const Tensor djoined = eh_proj.backward_input(ctx.eh_proj, dx);
  eh_proj.backward_weight(ctx.eh_proj);
  Tensor de = new_activation({N, C}, enorm.weight.name + ".dout", dout.dtype());
  Tensor dh = new_activation({N, C}, hnorm.weight.name + ".dout", dout.dtype());
  const auto on = kernels::ExecContext::on(djoined);
  kernels::copy_rows(on, {de.view({1, N, C}), 0, 0}, {djoined.view({1, N, 2 * C}), 0, 0}, N, C);
  kernels::copy_rows(on, {dh.view({1, N, C}), 0, 0}, {djoined.view({1, N, 2 * C}), 0, C}, N, C);
  Tensor demb = enorm.backward_input(ctx.enorm, de), dhidden = hnorm.backward_input(ctx.hnorm, dh);
  hnorm.backward_weight(ctx.hnorm);
  enorm.backward_weight(ctx.enorm);
  ctx = {};
  return {demb, dhidden};
}

Tensor MtpLayer::forward_cached(KVCache& cache, const Tensor& emb, const Tensor& hidden, int64_t B, int64_t T) {
  NormCtx norm_ctx;
  return final_norm.forward(norm_ctx, block.forward_cached(cache, combine(nullptr, emb, hidden), B, T));
}

void MtpLayer::parameters(ParameterList& out) {
  enorm.parameters(out);
  hnorm.parameters(out);
  eh_proj.parameters(out);
  block.parameters(out);
  final_norm.parameters(out);
}

void MtpLayer::gemm_weights(ParameterList& out) {
  out.push_back(&eh_proj.weight);
  block.gemm_weights(out);
}

}  // namespace megaton::nn
