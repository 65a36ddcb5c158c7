#include "megaton/nn/embedding.h"

#include "megaton/kernels/embedding.h"
#include "megaton/kernels/reduce.h"
#include "megaton/nn/linear.h"

namespace megaton::nn {

Embedding::Embedding(int64_t vocab, int64_t hidden, int64_t max_positions, bool learned_positions)
    : word("embedding.word_embeddings.weight", {vocab, hidden}, false, ShardSpec::tensor_parallel(0)),
      vocab_(vocab),
      hidden_(hidden) {
  if (learned_positions) position = Parameter("embedding.position_embeddings.weight", {max_positions, hidden}, false);
}

Tensor Embedding::forward(const Tensor& tokens, int64_t pos_offset, DType dtype) {
  const int64_t B = tokens.size(0), T = tokens.size(1);
  const int32_t* ids = tokens.data<int32_t>();
  const int64_t bad = kernels::first_out_of_range(kernels::ExecContext::on(tokens), tokens, vocab_);
  if (bad >= 0)
    fail("token id ", ids[bad], " at position ", bad, " of '", tokens.name(), "' is outside the model's vocabulary of ",
         vocab_, " (vocab mismatch between data and model?)");
  if (position.value.defined() && pos_offset + T > position.value.size(0))
    fail("sequence of ", pos_offset + T, " tokens exceeds max_position_embeddings ", position.value.size(0));
  Tensor out = new_activation({B * T, hidden_}, "embedding.out");
  const Tensor wpe = position.value.defined() ? position.value.slice_rows(pos_offset, pos_offset + T) : Tensor();
  kernels::embedding_forward(kernels::ExecContext::on(tokens), out, tokens, word.value, wpe);
  return as_dtype(out, dtype);
}

void Embedding::backward_weight(const Tensor& tokens, const Tensor& dy) {
  // Training runs from position 0, so the positions used are the first T rows.
  const Tensor dwpe = position.grad.defined() ? position.grad.slice_rows(0, tokens.size(1)) : Tensor();
  kernels::embedding_backward(kernels::ExecContext::on(dy), word.grad, dwpe, as_dtype(dy, DType::F32), tokens);
  // Reverse order of registration (the gradient buffer's order): positions, then words.
  if (position.grad.defined()) position.grad_accumulated();
  word.grad_accumulated();
}

void Embedding::parameters(ParameterList& out) {
  out.push_back(&word);
  if (position.value.defined()) out.push_back(&position);
}

}  // namespace megaton::nn
