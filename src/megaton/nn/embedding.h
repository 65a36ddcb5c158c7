// Word embedding plus optional learned absolute position embedding. Its gradient is a weight
// gradient only (tokens have no gradient), so backward is a single W call.
//
// Over a tensor-parallel group it is Megatron's VocabParallelEmbedding: the word table's rows, the
// vocabulary padded to `padded_vocab` (a multiple of make_vocab_size_divisible_by x tp), are split
// evenly; each rank looks up the tokens in its rows (zeros for the others) and the sum over the
// group is the embedding; positions are added to the sum, and under sequence parallelism each rank
// keeps its block of rows (the scatter into the sequence-parallel region).
#pragma once
#include "megaton/nn/tensor_parallel.h"

namespace megaton::nn {

class Embedding {
 public:
  Embedding(int64_t vocab, int64_t padded_vocab, int64_t hidden, int64_t max_positions, bool learned_positions,
            const TensorParallel& tp = {});
  // tokens [B, T] (i32) -> [B*T, hidden] (this rank's rows under sequence parallelism) in `dtype`
  // (the model's compute dtype; the lookup itself reads the f32 tables). Token ids outside the
  // vocabulary are an error.
  Tensor forward(const Tensor& tokens, int64_t pos_offset = 0, DType dtype = DType::F32);
  // dy in any dtype; the table gradients accumulate in f32.
  void backward_weight(const Tensor& tokens, const Tensor& dy);
  void parameters(ParameterList& out);

  Parameter word;      // [padded_vocab / tp, hidden]: this rank's rows
  Parameter position;  // [max_positions, hidden], undefined with rotary embeddings

 private:
  // tokens as indices into this rank's rows; `outside` marks (1) the tokens another rank holds,
  // which then index row 0.
  Tensor local_ids(const Tensor& tokens, std::vector<uint8_t>& outside) const;
  int64_t vocab_, hidden_;
  int64_t vocab_start_ = 0;  // this rank's first row
  TensorParallel tp_;
};

}  // namespace megaton::nn
