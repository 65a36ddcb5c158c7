#include "megaton/models/tensor_parallel_weights.h"

#include "megaton/nn/tensor_shards.h"

namespace megaton::models {

void copy_weights(const TransformerModel& from, TransformerModel& to) {
  const nn::ParameterList& src = from.parameters();
  const nn::ParameterList& dst = to.parameters();
  MEGATON_CHECK(src.size() == dst.size(), "copying the weights of a model with ", src.size(), " parameters into one with ",
                dst.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i]->name != dst[i]->name || nn::global_shape(*src[i]) != nn::global_shape(*dst[i]))
      fail("copying weights: parameter '", src[i]->name, "' ", shape_str(nn::global_shape(*src[i])), " meets '",
           dst[i]->name, "' ", shape_str(nn::global_shape(*dst[i])));
    nn::slice_global(*dst[i], nn::gather_global(*src[i], src[i]->value, from.tensor_parallel()), dst[i]->value);
  }
}

std::unique_ptr<TransformerModel> gather_whole_model(const TransformerModel& m) {
  auto whole = std::make_unique<TransformerModel>(m.config());
  copy_weights(m, *whole);
  if (m.compute_dtype() != DType::F32) whole->set_compute_dtype(m.compute_dtype());
  return whole;
}

}  // namespace megaton::models
