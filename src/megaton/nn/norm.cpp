#include "megaton/nn/norm.h"

#include "megaton/kernels/fp8_sources.h"
#include "megaton/kernels/norm.h"
#include "megaton/nn/linear.h"

namespace megaton::nn {

Norm::Norm(const std::string& name, int64_t hidden, Normalization kind, double eps, bool partial_grad)
    : weight(name + ".weight", {hidden}, false, ShardSpec::replicate(partial_grad)),
      hidden_(hidden),
      rms_(kind == Normalization::RMSNorm),
      eps_(eps) {
  if (!rms_) bias = Parameter(name + ".bias", {hidden}, false, ShardSpec::replicate(partial_grad));
}

Tensor Norm::forward(NormCtx& ctx, const Tensor& x) { return normalize(ctx, x, {}); }

Tensor Norm::forward_add(NormCtx& ctx, const Tensor& x, const Tensor& residual) {
  return normalize(ctx, x, residual);
}

Tensor Norm::normalize(NormCtx& ctx, const Tensor& x, const Tensor& residual) {
  const int64_t N = rows_of(x);
  Tensor y = new_activation({N, hidden_}, weight.name + ".out", x.dtype());  // statistics stay f32
  ctx.x = x;
  ctx.rstd = new_activation({N}, weight.name + ".rstd");
  const auto on = kernels::ExecContext::on(x);
  if (!rms_) ctx.mean = new_activation({N}, weight.name + ".mean");
  if (residual.defined()) {
    rms_ ? kernels::add_rmsnorm_forward(on, x, y, ctx.rstd, x, residual, weight.value, eps_)
         : kernels::add_layernorm_forward(on, x, y, ctx.mean, ctx.rstd, x, residual, weight.value, bias.value, eps_);
  } else {
    rms_ ? kernels::rmsnorm_forward(on, y, ctx.rstd, x, weight.value, eps_)
         : kernels::layernorm_forward(on, y, ctx.mean, ctx.rstd, x, weight.value, bias.value, eps_);
  }
  return y;
}

FusedInput Norm::fused_input(NormCtx& ctx, const Tensor& x, const Tensor& residual) {
  return {x.dtype(), [this, &ctx, x, residual] { return normalize(ctx, x, residual); },
          [this, &ctx, x, residual] {
            const int64_t N = rows_of(x);
            ctx.x = x;  // the sum, under a fused residual: written into x's storage
            ctx.rstd = new_activation({N}, weight.name + ".rstd");
            if (!rms_) ctx.mean = new_activation({N}, weight.name + ".mean");
            kernels::norm_statistics(kernels::ExecContext::on(x), residual.defined() ? x : Tensor(), ctx.mean, ctx.rstd,
                                     x, residual, eps_);
            return kernels::norm_fp8_source(x, ctx.mean, ctx.rstd, weight.value, bias.value, weight.name + ".out");
          }};
}

Tensor Norm::backward_input(NormCtx& ctx, const Tensor& dy, const Tensor& dresidual) {
  const int64_t N = rows_of(dy);
  Tensor dx = new_activation({N, hidden_}, weight.name + ".dx", dy.dtype());
  const auto on = kernels::ExecContext::on(dy);
  if (rms_)
    kernels::rmsnorm_backward_input(on, dx, dy, ctx.x, weight.value, ctx.rstd, dresidual);
  else
    kernels::layernorm_backward_input(on, dx, dy, ctx.x, weight.value, ctx.mean, ctx.rstd, dresidual);
  ctx.dy = dy;
  return dx;
}

void Norm::backward_weight(NormCtx& ctx) {
  const auto on = kernels::ExecContext::on(ctx.dy);
  if (rms_)
    kernels::rmsnorm_backward_weight(on, weight.grad, ctx.dy, ctx.x, ctx.rstd);
  else
    kernels::layernorm_backward_weight(on, weight.grad, bias.grad, ctx.dy, ctx.x, ctx.mean, ctx.rstd);
  // Reverse order of registration (the gradient buffer's order): bias, then weight.
  if (bias.grad.defined()) bias.grad_accumulated();
  weight.grad_accumulated();
  ctx = {};
}

void Norm::parameters(ParameterList& out) {
  out.push_back(&weight);
  if (bias.value.defined()) out.push_back(&bias);
}

}  // namespace megaton::nn
