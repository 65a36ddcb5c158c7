// Word embedding plus optional learned absolute position embedding. Its gradient is a weight
// gradient only (tokens have no gradient), so backward is a single W call.
#pragma once
#include "megaton/nn/parameter.h"

namespace megaton::nn {

class Embedding {
 public:
  Embedding(int64_t vocab, int64_t hidden, int64_t max_positions, bool learned_positions);
  // tokens [B, T] (i32) -> [B*T, hidden] in `dtype` (the model's compute dtype; the lookup itself
  // reads the f32 tables). Token ids outside the vocabulary are an error.
  Tensor forward(const Tensor& tokens, int64_t pos_offset = 0, DType dtype = DType::F32);
  // dy in any dtype; the table gradients accumulate in f32.
  void backward_weight(const Tensor& tokens, const Tensor& dy);
  void parameters(ParameterList& out);

  Parameter word;      // [vocab, hidden]
  Parameter position;  // [max_positions, hidden], undefined with rotary embeddings

 private:
  int64_t vocab_, hidden_;
};

}  // namespace megaton::nn
