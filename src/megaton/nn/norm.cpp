#include "megaton/nn/norm.h"

#include "megaton/kernels/norm.h"
#include "megaton/nn/linear.h"

namespace megaton::nn {

Norm::Norm(const std::string& name, int64_t hidden, bool rms, double eps)
    : weight(name + ".weight", {hidden}, false), hidden_(hidden), rms_(rms), eps_(eps) {
  if (!rms) bias = Parameter(name + ".bias", {hidden}, false);
}

Tensor Norm::forward(NormCtx& ctx, const Tensor& x) {
  const int64_t N = rows_of(x);
  Tensor y = new_activation({N, hidden_}, weight.name + ".out");
  ctx.x = x;
  ctx.rstd = new_activation({N}, weight.name + ".rstd");
  if (rms_) {
    kernels::rmsnorm_forward(y.data<float>(), ctx.rstd.data<float>(), x.data<float>(), weight.value.data<float>(), N,
                             hidden_, eps_);
  } else {
    ctx.mean = new_activation({N}, weight.name + ".mean");
    kernels::layernorm_forward(y.data<float>(), ctx.mean.data<float>(), ctx.rstd.data<float>(), x.data<float>(),
                               weight.value.data<float>(), bias.value.data<float>(), N, hidden_, eps_);
  }
  return y;
}

Tensor Norm::backward_input(NormCtx& ctx, const Tensor& dy) {
  const int64_t N = rows_of(dy);
  Tensor dx = new_activation({N, hidden_}, weight.name + ".dx");
  if (rms_)
    kernels::rmsnorm_backward_input(dx.data<float>(), dy.data<float>(), ctx.x.data<float>(), weight.value.data<float>(),
                                    ctx.rstd.data<float>(), N, hidden_);
  else
    kernels::layernorm_backward_input(dx.data<float>(), dy.data<float>(), ctx.x.data<float>(),
                                      weight.value.data<float>(), ctx.mean.data<float>(), ctx.rstd.data<float>(), N,
                                      hidden_);
  ctx.dy = dy;
  return dx;
}

void Norm::backward_weight(NormCtx& ctx) {
  const int64_t N = rows_of(ctx.dy);
  if (rms_)
    kernels::rmsnorm_backward_weight(weight.grad.data<float>(), ctx.dy.data<float>(), ctx.x.data<float>(),
                                     ctx.rstd.data<float>(), N, hidden_);
  else
    kernels::layernorm_backward_weight(weight.grad.data<float>(), bias.grad.data<float>(), ctx.dy.data<float>(),
                                       ctx.x.data<float>(), ctx.mean.data<float>(), ctx.rstd.data<float>(), N,
                                       hidden_);
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
