#include "megaton/nn/parameter.h"

#include "megaton/core/error.h"
#include "megaton/kernels/quantized_linear.h"

namespace megaton::nn {

Parameter::Parameter(std::string n, Shape shape, bool decay, ShardSpec shard_spec)
    : name(std::move(n)),
      value(UnclearedValues::active() ? Tensor::empty(shape, DType::F32, MemCategory::Params, name)
                                      : Tensor::zeros(shape, DType::F32, MemCategory::Params, name)),
      grad(NoGradients::active() ? Tensor() : Tensor::zeros(shape, DType::F32, MemCategory::Grads, name + ".grad")),
      weight_decay(decay),
      shard(shard_spec) {}

void add_compute_copy(Parameter& p, DType dtype) {
  p.compute = Tensor::empty(p.value.shape(), dtype, MemCategory::Params, p.name + ".compute", p.value.device());
  p.compute.copy_from(p.value);
}

void refresh_compute_copies(const ParameterList& params) {
  for (Parameter* p : params) {
    // A model held in its compute dtype only (an inference model loaded in bf16) lends its values as copies.
    if (p->compute.defined() && !p->compute.shares_storage_with(p->value)) p->compute.copy_from(p->value);
    ++p->version;
  }
}

void zero_grads(const ParameterList& params) {
  for (auto* p : params) p->grad.zero_();
}

Tensor f32_values(const Parameter& p) {
  const DType held = p.value.dtype();
  if (held == DType::F32) return p.value;
  if (held == DType::BF16 || held == DType::F16) return p.value.to(DType::F32, MemCategory::Workspace);
  if (p.quantized && p.quantized->codes.shares_storage_with(p.value)) return kernels::dequantize_weight(*p.quantized);
  fail("weight '", p.name, "' holds ", dtype_name(held), " codes without their scales");
}

int64_t count_parameters(const ParameterList& params) {
  int64_t n = 0;
  for (auto* p : params) n += p->value.numel();
  return n;
}

}  // namespace megaton::nn
