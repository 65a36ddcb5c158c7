// A trainable parameter: fp32 value (the master weight) and its fp32 gradient accumulator.
#pragma once
#include <string>
#include <vector>

#include "megaton/core/tensor.h"

namespace megaton::nn {

struct Parameter {
  std::string name;           // HF-style name, e.g. "model.layers.0.self_attn.q_proj.weight"
  Tensor value;               // MemCategory::Params
  Tensor grad;                // MemCategory::Grads, same shape, accumulated by backward
  bool weight_decay = true;   // false for norms, biases and embeddings by default

  Parameter() = default;
  Parameter(std::string n, Shape shape, bool decay);
};

using ParameterList = std::vector<Parameter*>;

void zero_grads(const ParameterList& params);
int64_t count_parameters(const ParameterList& params);

}  // namespace megaton::nn
