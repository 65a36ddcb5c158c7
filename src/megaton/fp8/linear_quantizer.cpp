#include "megaton/fp8/linear_quantizer.h"

#include "megaton/kernels/reduce.h"

namespace megaton::fp8 {

LinearQuantizer::LinearQuantizer(std::string name, const Fp8Config& config)
    : config_(config),
      input_{name + ".input_fp8", config.forward_format(), config.activation_granularity(), std::nullopt},
      weight_{name + ".weight_fp8", config.forward_format(), config.weight_granularity(), std::nullopt},
      grad_{name + ".grad_output_fp8", config.gradient_format(), config.activation_granularity(), std::nullopt} {
  if (config.recipe == Recipe::Delayed)
    for (Role* r : {&input_, &weight_, &grad_}) r->delayed.emplace(r->format, config.delayed);
}

kernels::Fp8QuantizeOptions LinearQuantizer::options(Role& role, bool transpose, MemCategory cat) const {
  kernels::Fp8QuantizeOptions o{.format = role.format,
                                .granularity = role.granularity,
                                .pow2_scales = config_.pow2_scales,
                                .transpose = transpose,
                                .category = cat};
  if (role.delayed) {
    if (!role.delayed->scale()) fail(role.name, ": delayed FP8 scaling has no scale yet; the linear must calibrate first");
    o.scale = *role.delayed->scale();
  }
  return o;
}

kernels::Fp8Matrix LinearQuantizer::quantize(Role& role, const Tensor& t, bool transpose, const std::string& name,
                                             MemCategory cat) {
  kernels::Fp8Matrix q = kernels::fp8_quantize(t, options(role, transpose, cat), name);
  if (role.delayed) role.delayed->record(q.amax);
  return q;
}

LinearQuantizer::Input LinearQuantizer::input(const kernels::Fp8Source& x) {
  kernels::Fp8StripeQuantizer stripes = input_stripes(x);
  if (x.rows > 0) stripes.rows(0, x.rows);
  return finish_input(stripes);
}

kernels::Fp8StripeQuantizer LinearQuantizer::input_stripes(const kernels::Fp8Source& x) {
  // Per-tensor scales give the transposed codes exactly; tiles are re-cut along M (DeepSeek-V3's
  // re-tiling). Either way both layouts come from the one pass.
  return {x, options(input_, false, MemCategory::Activations), true, true, input_.name, input_.name + "_t"};
}

LinearQuantizer::Input LinearQuantizer::finish_input(kernels::Fp8StripeQuantizer& stripes) {
  kernels::Fp8Layouts q = stripes.finish();
  if (input_.delayed) input_.delayed->record(q.rowwise.amax);
  return {std::move(q.rowwise), std::move(q.columnwise)};
}

const kernels::Fp8Matrix& LinearQuantizer::weight(const Tensor& w, uint64_t version) {
  if (!weight_cache_ || weight_cache_->version != version) {
    weight_cache_.reset();  // free the old copy before making the new one
    weight_cache_ = Cached{version, quantize(weight_, w, false, weight_.name, MemCategory::Params)};
  }
  return weight_cache_->matrix;
}

const kernels::Fp8Matrix& LinearQuantizer::weight_transposed(const Tensor& w, uint64_t version) {
  if (!weight_t_cache_ || weight_t_cache_->version != version) {
    weight_t_cache_.reset();
    // 128x128 blocks and per-tensor scales transpose exactly; MX tiles are re-cut from the weight.
    const bool exact = weight_.granularity != kernels::Fp8Granularity::Mx1x32;
    weight_t_cache_ = Cached{version, exact ? kernels::fp8_transpose(weight(w, version), weight_.name + "_t")
                                            : quantize(weight_, w, true, weight_.name + "_t", MemCategory::Params)};
  }
  return weight_t_cache_->matrix;
}

kernels::Fp8Matrix LinearQuantizer::grad_output(const Tensor& dy) {
  return quantize(grad_, dy, false, grad_.name, MemCategory::Activations);
}

kernels::Fp8Matrix LinearQuantizer::grad_output_transposed(const Tensor& dy) {
  return quantize(grad_, dy, true, grad_.name + "_t", MemCategory::Activations);
}

bool LinearQuantizer::calibrating() const {
  for (const Role* r : {&input_, &weight_, &grad_})
    if (r->delayed && !r->delayed->scale()) return true;
  return false;
}

void LinearQuantizer::observe(Role& role, const Tensor& t) {
  role.delayed->record(kernels::abs_max(kernels::ExecContext::on(t), t));
}

void LinearQuantizer::next_step() {
  for (Role* r : {&input_, &weight_, &grad_})
    if (r->delayed) r->delayed->update();
}

std::vector<DelayedScaling*> LinearQuantizer::delayed_states() {
  std::vector<DelayedScaling*> states;
  for (Role* r : {&input_, &weight_, &grad_})
    if (r->delayed) states.push_back(&*r->delayed);
  return states;
}

std::vector<std::pair<std::string, const DelayedScaling*>> LinearQuantizer::named_delayed_states() const {
  std::vector<std::pair<std::string, const DelayedScaling*>> states;
  for (const Role* r : {&input_, &weight_, &grad_})
    if (r->delayed) states.emplace_back(r->name, &*r->delayed);
  return states;
}

}  // namespace megaton::fp8
