// Pre-norm decoder block: x + attn(norm1(x)), then + mlp(norm2(.)).
#pragma once
#include "megaton/nn/attention.h"
#include "megaton/nn/mlp.h"
#include "megaton/nn/norm.h"

namespace megaton::nn {

struct BlockSpec {
  AttentionShape attn;
  int64_t ffn_hidden;
  bool rms_norm;
  double norm_eps;
  bool swiglu;
  bool bias;
};

struct BlockCtx {
  NormCtx norm1, norm2;
  AttentionCtx attn;
  MlpCtx mlp;
};

class TransformerBlock {
 public:
  TransformerBlock(const std::string& name, const BlockSpec& spec, const RopeTables* rope);
  Tensor forward(BlockCtx& ctx, const Tensor& x, int64_t B, int64_t T);
  Tensor backward_input(BlockCtx& ctx, const Tensor& dy, int64_t B, int64_t T);
  void backward_weight(BlockCtx& ctx);
  Tensor forward_cached(KVCache& cache, const Tensor& x, int64_t B, int64_t T);
  void parameters(ParameterList& out);

  Norm input_norm;
  SelfAttention attention;
  Norm pre_mlp_norm;
  Mlp mlp;
};

}  // namespace megaton::nn
