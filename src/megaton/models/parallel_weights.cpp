#include "megaton/models/parallel_weights.h"

#include <map>

#include "megaton/nn/tensor_shards.h"

namespace megaton::models {

Tensor gather_stage_tensor(const TransformerModel& from, int64_t position, const nn::Parameter* p, const Tensor& local,
                           const Shape& global_shape, const std::string& name) {
  const StageLayout& layout = from.stage_layout();
  const int holder = layout.holder(position);
  const bool here = holder == layout.rank();
  if (here && !p) fail("pipeline rank ", holder, " holds position ", position, " of the model but no parameter '", name, "'");
  Tensor global = here ? nn::gather_global(*p, local, from.shard_groups())
                       : Tensor::empty(global_shape, DType::F32, MemCategory::Workspace, name);
  if (global.shape() != global_shape)
    fail("parameter '", name, "' has global shape ", shape_str(global.shape()), ", expected ", shape_str(global_shape));
  if (layout.split()) layout.group->broadcast(global, holder);
  return global;
}

void copy_weights(const TransformerModel& from, TransformerModel& to) {
  // Every rank must walk the same parameters for the pipeline broadcasts to pair up.
  MEGATON_CHECK(!from.stage_layout().split() || !to.stage_layout().split(),
                "copying weights between two models cut into pipeline stages; gather one of them whole first");
  std::map<std::string, const nn::Parameter*> src;
  for (const nn::Parameter* p : from.parameters()) src.emplace(p->name, p);
  const nn::ParameterList& dst = to.parameters();
  for (size_t i = 0; i < dst.size(); ++i) {
    const auto it = src.find(dst[i]->name);
    const nn::Parameter* p = it == src.end() ? nullptr : it->second;
    if (p && nn::global_shape(*p) != nn::global_shape(*dst[i]))
      fail("copying weights: parameter '", p->name, "' ", shape_str(nn::global_shape(*p)), " meets '", dst[i]->name,
           "' ", shape_str(nn::global_shape(*dst[i])));
    if (!p && !from.stage_layout().split())
      fail("copying weights: parameter '", dst[i]->name, "' is not in the source model");
    nn::slice_global(*dst[i],
                     gather_stage_tensor(from, to.position(i), p, p ? p->value : Tensor(), nn::global_shape(*dst[i]),
                                         dst[i]->name),
                     dst[i]->value);
  }
}

std::unique_ptr<TransformerModel> gather_whole_model(const TransformerModel& m) {
  auto whole = std::make_unique<TransformerModel>(m.config());
  copy_weights(m, *whole);
  if (m.compute_dtype() != DType::F32) whole->set_compute_dtype(m.compute_dtype());
  return whole;
}

}  // namespace megaton::models
