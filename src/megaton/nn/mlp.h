// Feed-forward block: linear_fc1 -> GeLU or SwiGLU -> linear_fc2. For SwiGLU, fc1 produces
// [gate | up] (2 x ffn_hidden outputs) in one GEMM, as Megatron's gated linear units do.
#pragma once
#include "megaton/nn/linear.h"

namespace megaton::nn {

struct MlpCtx {
  LinearCtx fc1_ctx;
  Tensor h;  // fc1 output (activation input)
  LinearCtx fc2_ctx;
};

class Mlp {
 public:
  Mlp(const std::string& name, int64_t hidden, int64_t ffn_hidden, bool swiglu, bool bias);
  Tensor forward(MlpCtx& ctx, const Tensor& x);
  Tensor backward_input(MlpCtx& ctx, const Tensor& dy);
  void backward_weight(MlpCtx& ctx);
  void parameters(ParameterList& out);

  Linear fc1;
  Linear fc2;

 private:
  int64_t ffn_;
  bool swiglu_;
};

}  // namespace megaton::nn
