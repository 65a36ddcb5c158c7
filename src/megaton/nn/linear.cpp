#include "megaton/nn/linear.h"

#include "megaton/kernels/linear.h"

namespace megaton::nn {

int64_t rows_of(const Tensor& t) { return t.numel() / t.size(-1); }

Tensor new_activation(Shape shape, const std::string& name, DType dtype) {
  return Tensor::empty(std::move(shape), dtype, MemCategory::Activations, name);
}

Tensor as_dtype(const Tensor& t, DType dtype) {
  return t.dtype() == dtype ? t : t.to(dtype, MemCategory::Activations);
}

Linear::Linear(const std::string& name, int64_t in_features, int64_t out_features, bool has_bias,
               LinearParallel parallel)
    : weight(name + ".weight", {out_features, in_features}, true,
             ShardSpec::tensor_parallel(parallel == LinearParallel::Column ? 0 : 1)),
      in_(in_features),
      out_(out_features) {
  if (has_bias)
    bias = Parameter(name + ".bias", {out_features}, false,
                     parallel == LinearParallel::Column ? ShardSpec::tensor_parallel(0) : ShardSpec::replicate());
}

Tensor Linear::forward(LinearCtx& ctx, const Tensor& x) {
  if (x.size(-1) != in_)
    fail("linear '", weight.name, "': input '", x.name(), "' has ", x.size(-1), " features, expected ", in_);
  const int64_t N = rows_of(x);
  Tensor y = new_activation({N, out_}, weight.name + ".out", x.dtype());
  kernels::linear_forward(kernels::ExecContext::on(x), y, x, weight.weight_in(x.dtype()), bias.value);
  ctx.x = x;
  return y;
}

Tensor Linear::backward_input(LinearCtx& ctx, const Tensor& dy) {
  const int64_t N = rows_of(dy);
  Tensor dx = new_activation({N, in_}, weight.name + ".dx", dy.dtype());
  kernels::linear_backward_input(kernels::ExecContext::on(dy), dx, dy, weight.weight_in(dy.dtype()));
  ctx.dy = dy;
  return dx;
}

void Linear::backward_weight(LinearCtx& ctx) {
  kernels::linear_backward_weight(kernels::ExecContext::on(ctx.dy), weight.grad, bias.grad, ctx.dy, ctx.x);
  // Reverse order of registration (the gradient buffer's order): bias, then weight.
  if (bias.grad.defined()) bias.grad_accumulated();
  weight.grad_accumulated();
  ctx = {};
}

void Linear::parameters(ParameterList& out) {
  out.push_back(&weight);
  if (bias.value.defined()) out.push_back(&bias);
}

}  // namespace megaton::nn
