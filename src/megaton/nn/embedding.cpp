#include "megaton/nn/embedding.h"

#include <cstring>

#include "megaton/kernels/activation.h"
#include "megaton/kernels/embedding.h"
#include "megaton/kernels/reduce.h"
#include "megaton/nn/linear.h"
#include "megaton/parallel/tensor_parallel_mappings.h"

namespace megaton::nn {

namespace {
// rows[n] = 0 for every n with outside[n] (host f32 rows).
void zero_rows(const Tensor& rows, const std::vector<uint8_t>& outside) {
  const int64_t C = rows.size(-1);
  float* d = rows.data<float>();
  for (size_t n = 0; n < outside.size(); ++n)
    if (outside[n]) std::memset(d + static_cast<int64_t>(n) * C, 0, static_cast<size_t>(C) * sizeof(float));
}

// rows[b*T + t] += wpe[t] for every sequence b.
void add_positions(const Tensor& rows, const Tensor& wpe, int64_t B, int64_t T) {
  const auto on = kernels::ExecContext::on(rows);
  for (int64_t b = 0; b < B; ++b) {
    const Tensor r = rows.slice_rows(b * T, (b + 1) * T);
    kernels::residual_forward(on, r, r, wpe);
  }
}
}  // namespace

Embedding::Embedding(int64_t vocab, int64_t padded_vocab, int64_t hidden, int64_t max_positions,
                     bool learned_positions, const TensorParallel& tp)
    : vocab_(vocab), hidden_(hidden), tp_(tp) {
  MEGATON_CHECK(padded_vocab >= vocab, "padded vocabulary ", padded_vocab, " below the vocabulary ", vocab);
  auto pieces = even_pieces({padded_vocab}, tp.size(), "padded vocabulary");
  const ShardPiece mine = pieces.at(static_cast<size_t>(tp.rank())).front();
  vocab_start_ = mine.start;
  word = Parameter("embedding.word_embeddings.weight", {mine.length, hidden}, false,
                   split_spec(0, vocab, tp, std::move(pieces)));
  if (learned_positions) position = Parameter("embedding.position_embeddings.weight", {max_positions, hidden}, false);
}

Tensor Embedding::local_ids(const Tensor& tokens, std::vector<uint8_t>& outside) const {
  MEGATON_CHECK(tokens.device().is_cpu(), "the vocab-parallel embedding reads host token ids");
  Tensor ids = Tensor::empty(tokens.shape(), DType::I32, MemCategory::Activations, "embedding.local_ids");
  const int32_t* t = tokens.data<int32_t>();
  int32_t* out = ids.data<int32_t>();
  const int64_t rows = word.value.size(0);
  outside.assign(static_cast<size_t>(tokens.numel()), 0);
  for (int64_t n = 0; n < tokens.numel(); ++n) {
    const int64_t local = t[n] - vocab_start_;
    const bool mine = local >= 0 && local < rows;
    outside[static_cast<size_t>(n)] = !mine;
    out[n] = mine ? static_cast<int32_t>(local) : 0;
  }
  return ids;
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
  const auto on = kernels::ExecContext::on(tokens);
  if (!tp_.active()) {
    kernels::embedding_forward(on, out, tokens, word.value, wpe);
    return as_dtype(out, dtype);
  }
  std::vector<uint8_t> outside;
  kernels::embedding_forward(on, out, local_ids(tokens, outside), word.value, Tensor());
  zero_rows(out, outside);
  parallel::reduce_from_region(*tp_.group, out);
  if (wpe.defined()) add_positions(out, wpe, B, T);
  if (tp_.sequence_parallel) out = parallel::scatter_rows(*tp_.group, out, "embedding.out");
  return as_dtype(out, dtype);
}

void Embedding::backward_weight(const Tensor& tokens, const Tensor& dy) {
  const int64_t T = tokens.size(1);
  // Training runs from position 0, so the positions used are the first T rows.
  const Tensor dwpe = position.grad.defined() ? position.grad.slice_rows(0, T) : Tensor();
  Tensor d = as_dtype(dy, DType::F32);
  if (!tp_.active()) {
    kernels::embedding_backward(kernels::ExecContext::on(d), word.grad, dwpe, d, tokens);
  } else {
    if (tp_.sequence_parallel) d = parallel::gather_rows(*tp_.group, d, "embedding.dy");  // the scatter's backward
    if (dwpe.defined())
      for (int64_t b = 0; b < tokens.size(0); ++b) {
        const Tensor rows = d.slice_rows(b * T, (b + 1) * T);
        kernels::residual_forward(kernels::ExecContext::on(d), dwpe, dwpe, rows);
      }
    // The sum's backward is the identity: each rank adds the rows of its own tokens.
    std::vector<uint8_t> outside;
    const Tensor ids = local_ids(tokens, outside);
    Tensor masked = d;
    if (d.raw() == dy.raw()) {  // dy itself: zero a copy's rows, not the caller's
      masked = new_activation(d.shape(), "embedding.dy_masked");
      masked.copy_from(d);
    }
    zero_rows(masked, outside);
    kernels::embedding_backward(kernels::ExecContext::on(masked), word.grad, Tensor(), masked, ids);
  }
  // Reverse order of registration (the gradient buffer's order): positions, then words.
  if (position.grad.defined()) position.grad_accumulated();
  word.grad_accumulated();
}

void Embedding::parameters(ParameterList& out) {
  out.push_back(&word);
  if (position.value.defined()) out.push_back(&position);
}

}  // namespace megaton::nn
