// Linear layer y = x W^T + b with the backward split into input (B) and weight (W) halves:
// backward_input keeps dy in the context so backward_weight can run later (Zero Bubble).
#pragma once
#include "megaton/nn/parameter.h"

namespace megaton::nn {

struct LinearCtx {
  Tensor x;   // input, saved by forward
  Tensor dy;  // output gradient, saved by backward_input for backward_weight
};

// Megatron's split of a linear over the tensor-parallel group: Column splits the output features
// (weight and bias along dim 0), Row the input features (weight along dim 1, bias replicated).
enum class LinearParallel { Column, Row };

class Linear {
 public:
  Linear(const std::string& name, int64_t in_features, int64_t out_features, bool bias, LinearParallel parallel);
  Tensor forward(LinearCtx& ctx, const Tensor& x);           // x [N, in] -> [N, out]
  Tensor backward_input(LinearCtx& ctx, const Tensor& dy);   // -> dx [N, in]
  void backward_weight(LinearCtx& ctx);                      // dW += dy^T x, db += sum dy; frees ctx
  void parameters(ParameterList& out);
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

  Parameter weight;  // [out, in]
  Parameter bias;    // [out], undefined when the layer has no bias

 private:
  int64_t in_, out_;
};

// Rows of an activation tensor viewed as a matrix [N, last_dim].
int64_t rows_of(const Tensor& t);
// An activation (MemCategory::Activations) of the given dtype: a module's outputs take the dtype
// of its input, so the model's compute dtype flows from the embedding output through every layer.
Tensor new_activation(Shape shape, const std::string& name, DType dtype = DType::F32);
// t itself when it already holds `dtype`, else a converted copy (for kernels that compute in f32
// only, and back).
Tensor as_dtype(const Tensor& t, DType dtype);

}  // namespace megaton::nn
