#include "megaton/nn/linear.h"

#include "megaton/kernels/fp8_gemm.h"
#include "megaton/kernels/quantized_linear.h"
#include "megaton/kernels/linear.h"
#include "megaton/parallel/tensor_parallel_mappings.h"

namespace megaton::nn {

int64_t rows_of(const Tensor& t) { return t.numel() / t.size(-1); }

Tensor new_activation(Shape shape, const std::string& name, DType dtype) {
  return Tensor::empty(std::move(shape), dtype, MemCategory::Activations, name);
}

Tensor as_dtype(const Tensor& t, DType dtype) {
  return t.dtype() == dtype ? t : t.to(dtype, MemCategory::Activations);
}

namespace {
std::vector<std::vector<ShardPiece>> or_even(std::vector<std::vector<ShardPiece>> pieces, int64_t n,
                                             const TensorParallel& tp, const std::string& what) {
  return pieces.empty() ? even_pieces({n}, tp.size(), what) : std::move(pieces);
}
}  // namespace

Linear::Linear(const std::string& name, int64_t in_features, int64_t out_features, bool has_bias,
               LinearParallel parallel, const TensorParallel& tp, std::vector<std::vector<ShardPiece>> out_pieces)
    : parallel_(parallel), tp_(tp) {
  const bool column = parallel == LinearParallel::Column;
  auto pieces = column ? or_even(std::move(out_pieces), out_features, tp, name + " output features")
                       : even_pieces({in_features}, tp.size(), name + " input features");
  const int64_t local = local_extent(pieces.at(static_cast<size_t>(tp.rank())));
  in_ = column ? in_features : local;
  out_ = column ? local : out_features;
  // Without a group the layer is whole on every rank: replicated, so a model split over some other
  // group (MLA's down-projections, MTP's eh_proj beside tensor-parallel layers) counts its weights
  // once in norms and checkpoints, not once per rank.
  const ShardSpec spec = tp.active() ? split_spec(column ? 0 : 1, column ? out_features : in_features, tp, pieces)
                                     : ShardSpec::replicate();
  weight = Parameter(name + ".weight", {out_, in_}, true, spec);
  if (has_bias) bias = Parameter(name + ".bias", {out_}, false, column ? spec : ShardSpec::replicate());
}

Tensor Linear::forward(LinearCtx& ctx, const Tensor& x, OutputEpilogue* epilogue) {
  if (x.size(-1) != in_)
    fail("linear '", weight.name, "': input '", x.name(), "' has ", x.size(-1), " features, expected ", in_);
  const bool column = parallel_ == LinearParallel::Column;
  const Tensor xin = column && tp_.splits_sequence() ? parallel::gather_rows(*tp_.group, x, weight.name + ".x") : x;
  const int64_t N = rows_of(xin);
  if (forward_in_fp8())
    return reduce_output(fp8_forward(ctx, kernels::fp8_source(xin.view({N, in_})), x.dtype(), epilogue));
  MEGATON_CHECK(!epilogue, "linear '", weight.name, "': an output epilogue needs the FP8 forward");
  Tensor y = new_activation({N, out_}, weight.name + ".out", x.dtype());
  // A row-parallel bias is added once to the sum: by rank 0's partial output.
  const Tensor& b = bias_deferred_ || (!column && tp_.rank() != 0) ? Tensor() : bias.value;
  const auto exec = kernels::ExecContext::on(xin);
  if (weight.quantized) {
    kernels::quantized_linear_forward(exec, y, xin, *weight.quantized, b);  // inference: no ctx.x kept
  } else {
    if (fp8_) {
      fp8_->observe_input(xin);
      fp8_->observe_weight(weight.value);
    }
    kernels::linear_forward(exec, y, xin, weight.weight_in(x.dtype()), b);
    ctx.x = xin;
  }
  return reduce_output(std::move(y));
}

Tensor Linear::forward(LinearCtx& ctx, FusedInput& x, OutputEpilogue* epilogue) {
  const bool gathers = parallel_ == LinearParallel::Column && tp_.splits_sequence();
  if (!forward_in_fp8() || gathers) return forward(ctx, x.written(), epilogue);
  const kernels::Fp8Source src = x.source();
  if (src.cols != in_) fail("linear '", weight.name, "': input '", src.name, "' has ", src.cols, " features, expected ", in_);
  return reduce_output(fp8_forward(ctx, src, x.dtype(), epilogue));
}

Tensor Linear::forward(LinearCtx& ctx, fp8::LinearQuantizer::Input x, DType dtype) {
  MEGATON_CHECK(forward_in_fp8(), "linear '", weight.name, "': a quantised input needs the FP8 forward");
  const int64_t N = x.fprop.data.size(0);
  if (x.fprop.data.size(1) != in_)
    fail("linear '", weight.name, "': input '", x.fprop.data.name(), "' has ", x.fprop.data.size(1),
         " features, expected ", in_);
  return reduce_output(
      fp8_gemm_forward(ctx, new_activation({N, out_}, weight.name + ".out", dtype), std::move(x), nullptr));
}

Tensor Linear::fp8_forward(LinearCtx& ctx, const kernels::Fp8Source& x, DType dtype, OutputEpilogue* epilogue) {
  Tensor y = new_activation({x.rows, out_}, weight.name + ".out", dtype);
  return fp8_gemm_forward(ctx, std::move(y), fp8_->input(x), epilogue);
}

Tensor Linear::fp8_gemm_forward(LinearCtx& ctx, Tensor y, fp8::LinearQuantizer::Input&& x, OutputEpilogue* epilogue) {
  const bool column = parallel_ == LinearParallel::Column;
  // Rows summed over the group afterwards are not final when the GEMM writes them.
  MEGATON_CHECK(!epilogue || column || !tp_.active(), "linear '", weight.name,
                "': an output epilogue needs rows that are final after the GEMM (not a row-parallel linear)");
  const Tensor& b = bias_deferred_ || (!column && tp_.rank() != 0) ? Tensor() : bias.value;
  kernels::Fp8RowsDone rows_done;
  if (epilogue) {
    epilogue->begin(y);
    rows_done = [epilogue](int64_t r0, int64_t r1) { epilogue->rows(r0, r1); };
  }
  const kernels::Fp8Matrix fprop = std::move(x.fprop);  // freed on return, before any reduction of y
  kernels::fp8_gemm(kernels::ExecContext::on(y), y, fprop, fp8_->weight(weight.value, weight.version), false, b,
                    rows_done);
  ctx.x_fp8 = std::move(x.wgrad);  // backward-W reads the 8-bit x^T; the input itself is not kept
  return y;
}

Tensor Linear::reduce_output(Tensor y) {
  if (parallel_ == LinearParallel::Column || !tp_.active()) return y;
  if (tp_.sequence_parallel) return parallel::reduce_scatter_rows(*tp_.group, y, weight.name + ".out");
  parallel::reduce_from_region(*tp_.group, y);
  return y;
}

Tensor Linear::backward_input(LinearCtx& ctx, const Tensor& dy) {
  if (weight.quantized) fail("linear '", weight.name, "': its weight is quantised for inference and cannot train");
  const bool column = parallel_ == LinearParallel::Column;
  const Tensor dyin =
      !column && tp_.splits_sequence() ? parallel::gather_rows(*tp_.group, dy, weight.name + ".dy") : dy;
  const int64_t N = rows_of(dyin);
  Tensor dx = new_activation({N, in_}, weight.name + ".dx", dy.dtype());
  const auto exec = kernels::ExecContext::on(dyin);
  if (fp8_ && !fp8_->calibrating()) {
    kernels::fp8_gemm(exec, dx, fp8_->grad_output(dyin.view({N, out_})), fp8_->weight_transposed(weight.value, weight.version));
  } else {
    if (fp8_) fp8_->observe_grad_output(dyin);
    kernels::linear_backward_input(exec, dx, dyin, weight.weight_in(dy.dtype()));
  }
  ctx.dy = dyin;
  if (!column || !tp_.active()) return dx;
  if (tp_.sequence_parallel) return parallel::reduce_scatter_rows(*tp_.group, dx, weight.name + ".dx");
  parallel::reduce_from_region(*tp_.group, dx);
  return dx;
}

void Linear::backward_weight(LinearCtx& ctx) {
  // A row-parallel bias's gradient is the sum over every row of the whole output gradient (ctx.dy,
  // gathered under sequence parallelism): the same on every rank, nothing to reduce.
  const auto exec = kernels::ExecContext::on(ctx.dy);
  const Tensor& dbias = bias_deferred_ ? Tensor() : bias.grad;
  if (ctx.x_fp8) {
    const int64_t N = rows_of(ctx.dy);
    kernels::fp8_gemm(exec, weight.grad, fp8_->grad_output_transposed(ctx.dy.view({N, out_})), *ctx.x_fp8, /*accumulate=*/true);
    if (dbias.defined()) kernels::bias_backward(exec, dbias, ctx.dy);
  } else {
    kernels::linear_backward_weight(exec, weight.grad, dbias, ctx.dy, ctx.x);
  }
  // Reverse order of registration (the gradient buffer's order): bias, then weight.
  if (bias.grad.defined()) bias.grad_accumulated();
  weight.grad_accumulated();
  ctx = {};
}

void Linear::enable_fp8(const fp8::Fp8Config& config) { fp8_ = std::make_unique<fp8::LinearQuantizer>(weight.name, config); }

void Linear::parameters(ParameterList& out) {
  out.push_back(&weight);
  if (bias.value.defined()) out.push_back(&bias);
}

}  // namespace megaton::nn
