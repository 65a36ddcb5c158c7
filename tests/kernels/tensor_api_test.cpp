// The tensor API of the families the CUDA backend does not have yet (embedding, cross-entropy):
// each call gives exactly what the CPU reference template gives on the same data, and bad
// tensors are errors naming the op and the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "../support/temp_dir.h"
#include "finite_diff.h"
#include "megaton/kernels/cpu/cross_entropy.h"
#include "megaton/kernels/cpu/embedding.h"
#include "megaton/kernels/copy.h"
#include "megaton/kernels/cross_entropy.h"
#include "megaton/kernels/embedding.h"

using namespace megaton;

namespace {
const kernels::ExecContext cpu;

// The first numel(shape) values of v as an f64 tensor.
Tensor from(const std::vector<double>& v, Shape shape, const std::string& name) {
  Tensor t = Tensor::empty(std::move(shape), DType::F64, MemCategory::Other, name);
  EXPECT_LE(static_cast<size_t>(t.numel()), v.size());
  std::copy_n(v.begin(), std::min(v.size(), static_cast<size_t>(t.numel())), t.data<double>());
  return t;
}

Tensor ids(const std::vector<int32_t>& v, Shape shape) {
  Tensor t = Tensor::empty(std::move(shape), DType::I32, MemCategory::Other, "ids");
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

std::vector<double> values(const Tensor& t) { return {t.data<double>(), t.data<double>() + t.numel()}; }
}  // namespace

TEST(TensorApi, EmbeddingForwardAndBackwardEqualTheReference) {
  const int64_t B = 3, T = 5, C = 7, V = 11;
  const std::vector<int32_t> tok = {1, 4, 4, 10, 0, 3, 3, 3, 9, 2, 0, 5, 6, 7, 8};  // repeated ids accumulate
  const auto wte = fd::random_vector(V * C, 1), wpe = fd::random_vector(T * C, 2), dy = fd::random_vector(B * T * C, 3);
  std::vector<double> out_ref(B * T * C), dwte_ref(V * C, 0.5), dwpe_ref(T * C, 0.25);
  kernels::cpu::embedding_forward(out_ref.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  kernels::cpu::embedding_backward(dwte_ref.data(), dwpe_ref.data(), dy.data(), tok.data(), B, T, C);

  Tensor out = Tensor::zeros({B * T, C}, DType::F64, MemCategory::Other, "out");
  Tensor dwte = from(std::vector<double>(V * C, 0.5), {V, C}, "dwte");
  Tensor dwpe = from(std::vector<double>(T * C, 0.25), {T, C}, "dwpe");
  kernels::embedding_forward(cpu, out, ids(tok, {B, T}), from(wte, {V, C}, "wte"), from(wpe, {T, C}, "wpe"));
  kernels::embedding_backward(cpu, dwte, dwpe, from(dy, {B * T, C}, "dy"), ids(tok, {B, T}));
  EXPECT_TRUE(fd::same_bits(values(out), out_ref));
  EXPECT_TRUE(fd::same_bits(values(dwte), dwte_ref));
  EXPECT_TRUE(fd::same_bits(values(dwpe), dwpe_ref));

  // Without positions, and the errors.
  kernels::embedding_forward(cpu, out, ids(tok, {B, T}), from(wte, {V, C}, "wte"), Tensor());
  Tensor f32_ids = Tensor::zeros({B, T}, DType::F32, MemCategory::Other, "float_ids");
  const Tensor W = from(wte, {V, C}, "wte");
  EXPECT_ERROR_CONTAINS(kernels::embedding_forward(cpu, out, f32_ids, W, Tensor()), "'float_ids' holds f32, expected i32");
  EXPECT_ERROR_CONTAINS(kernels::embedding_forward(cpu, out, ids(tok, {B, T}), W, from(wpe, {T - 1, C}, "short_wpe")),
                        "'short_wpe'");
}

TEST(TensorApi, EmbeddingForwardWidensABf16TableIntoF32Rows) {
  // A model served in bf16 alone (models/hf_format.h) holds its word embedding in bf16; the rows come
  // out in f32, beside f32 positions: each the widened table entry plus the position, exactly.
  const int64_t B = 2, T = 3, C = 5, V = 4;
  const std::vector<int32_t> tok = {3, 0, 3, 1, 2, 2};
  const auto wte = fd::random_vector(V * C, 5), wpe = fd::random_vector(T * C, 6);
  const Tensor table = from(wte, {V, C}, "wte").to(DType::BF16);
  const Tensor positions = from(wpe, {T, C}, "wpe").to(DType::F32);
  Tensor out = Tensor::empty({B * T, C}, DType::F32, MemCategory::Other, "out");
  for (const Tensor& p : {positions, Tensor()}) {
    kernels::embedding_forward(cpu, out, ids(tok, {B, T}), table, p);
    const Tensor widened = table.to(DType::F32);
    for (int64_t row = 0; row < B * T; ++row)
      for (int64_t c = 0; c < C; ++c) {
        const float want =
            widened.data<float>()[tok[row] * C + c] + (p.defined() ? p.data<float>()[row % T * C + c] : 0.0f);
        ASSERT_EQ(out.data<float>()[row * C + c], want) << row << ", " << c;
      }
  }
  // bf16 rows from a bf16 table have no CPU kernel; a bf16 table beside f64 rows is a mismatch.
  EXPECT_ERROR_CONTAINS(
      kernels::embedding_forward(cpu, Tensor::empty({B * T, C}, DType::F64, MemCategory::Other, "rows"),
                                 ids(tok, {B, T}), table, Tensor()),
      "'rows'");
}

TEST(TensorApi, CrossEntropyKernelsEqualTheReference) {
  const int64_t N = 6, V = 13, start = 2;  // a shard starting at vocabulary entry 2: targets 0 and 1 are elsewhere
  const std::vector<int32_t> tg = {3, kernels::kIgnoreIndex, 0, 14, 7, 7};
  const auto logits = fd::random_vector(N * V, 4, -3.0, 3.0);
  std::vector<double> max_ref(N), se_ref(N), tl_ref(N), loss_ref(N), lse_ref(N), dl_ref(N * V);
  kernels::cpu::cross_entropy_row_max(max_ref.data(), logits.data(), N, V);
  kernels::cpu::cross_entropy_sum_exp(se_ref.data(), tl_ref.data(), logits.data(), max_ref.data(), tg.data(), start, N,
                                      V);
  kernels::cpu::cross_entropy_loss(loss_ref.data(), lse_ref.data(), max_ref.data(), se_ref.data(), tl_ref.data(),
                                   tg.data(), N);
  kernels::cpu::cross_entropy_backward(dl_ref.data(), logits.data(), lse_ref.data(), tg.data(), start, 0.25, N, V);

  Tensor L = from(logits, {N, V}, "logits");
  const auto row = [](const char* name) { return Tensor::zeros({N}, DType::F64, MemCategory::Other, name); };
  Tensor row_max = row("row_max"), sum_exp = row("sum_exp"), target_logit = row("target_logit");
  Tensor loss = row("loss"), lse = row("lse");
  const Tensor targets = ids(tg, {N});
  kernels::cross_entropy_row_max(cpu, row_max, L);
  kernels::cross_entropy_sum_exp(cpu, sum_exp, target_logit, L, row_max, targets, start);
  kernels::cross_entropy_loss(cpu, loss, lse, row_max, sum_exp, target_logit, targets);
  kernels::cross_entropy_backward(cpu, L, L, lse, targets, start, 0.25);  // in place
  EXPECT_TRUE(fd::same_bits(values(row_max), max_ref));
  EXPECT_TRUE(fd::same_bits(values(sum_exp), se_ref));
  EXPECT_TRUE(fd::same_bits(values(target_logit), tl_ref));
  EXPECT_EQ(values(target_logit)[2], 0.0);  // target 0 lies in another shard
  EXPECT_TRUE(fd::same_bits(values(loss), loss_ref));
  EXPECT_TRUE(fd::same_bits(values(lse), lse_ref));
  EXPECT_TRUE(fd::same_bits(values(L), dl_ref));

  EXPECT_ERROR_CONTAINS(kernels::cross_entropy_sum_exp(cpu, sum_exp, target_logit, L, row_max, ids({1, 2}, {2}), 0),
                        "'sum_exp'");
  Tensor short_loss = Tensor::zeros({N - 1}, DType::F64, MemCategory::Other, "short_loss");
  EXPECT_ERROR_CONTAINS(kernels::cross_entropy_loss(cpu, short_loss, lse, row_max, sum_exp, target_logit, targets),
                        "'short_loss'");
  Tensor f32_max = Tensor::zeros({N}, DType::F32, MemCategory::Other, "f32_max");
  EXPECT_ERROR_CONTAINS(kernels::cross_entropy_row_max(cpu, f32_max, L), "'f32_max'");
}

// 16-bit logits (Megatron's bf16 head): the kernels widen each logit to fp32 as they read it and round
// the gradient as they write it, so every statistic equals the f32 kernels' on the widened logits bit
// for bit, and the in-place gradient equals their f32 gradient rounded once. V spans several of the
// sum's 256-entry chunks; the last columns are padding at -inf (fill_columns), one row is ignored.
class HalfLogits : public ::testing::TestWithParam<DType> {};

TEST_P(HalfLogits, CrossEntropyEqualsTheF32KernelsOnTheWidenedLogits) {
  const DType half = GetParam();
  const int64_t N = 5, V = 700, real_vocab = 690, start = 0;
  const Tensor targets = ids({3, kernels::kIgnoreIndex, 689, 0, 350}, {N});
  Tensor L16 = from(fd::random_vector(N * V, 9, -8.0, 8.0), {N, V}, "logits64").to(half);
  kernels::fill_columns(cpu, L16, real_vocab, -std::numeric_limits<double>::infinity());
  Tensor L32 = L16.to(DType::F32);  // exact
  const auto stats = [](const char* name) { return Tensor::zeros({N}, DType::F32, MemCategory::Other, name); };
  struct Stats {
    Tensor row_max, sum_exp, target_logit, loss, lse;
  };
  const auto run = [&](Tensor& logits) {
    Stats s{stats("row_max"), stats("sum_exp"), stats("target_logit"), stats("loss"), stats("lse")};
    kernels::cross_entropy_row_max(cpu, s.row_max, logits);
    kernels::cross_entropy_sum_exp(cpu, s.sum_exp, s.target_logit, logits, s.row_max, targets, start);
    kernels::cross_entropy_loss(cpu, s.loss, s.lse, s.row_max, s.sum_exp, s.target_logit, targets);
    kernels::cross_entropy_backward(cpu, logits, logits, s.lse, targets, start, 0.125);  // in place
    return s;
  };
  const Stats got = run(L16), want = run(L32);
  for (const auto& [g, w] : {std::pair{&got.row_max, &want.row_max}, {&got.sum_exp, &want.sum_exp},
                             {&got.target_logit, &want.target_logit}, {&got.loss, &want.loss}, {&got.lse, &want.lse}})
    EXPECT_EQ(std::memcmp(g->raw(), w->raw(), g->nbytes()), 0) << g->name();
  const Tensor want16 = L32.to(half);  // the f32 gradient rounded once
  EXPECT_EQ(std::memcmp(L16.raw(), want16.raw(), L16.nbytes()), 0);
  EXPECT_GT(got.loss.data<float>()[0], 0.0f);  // a real loss, not zeros on both sides
  EXPECT_EQ(L16.to(DType::F32).data<float>()[V + 5], 0.0f);  // the ignored row's gradient
  EXPECT_EQ(L16.to(DType::F32).data<float>()[V - 1], 0.0f);  // a padding column's gradient
  EXPECT_NE(L16.to(DType::F32).data<float>()[3], 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Kernels, HalfLogits, ::testing::Values(DType::BF16, DType::F16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(TensorApi, FillColumnsChecksItsRange) {
  Tensor t = Tensor::zeros({2, 4}, DType::F32, MemCategory::Other, "t");
  kernels::fill_columns(cpu, t, 4, 1.0);  // nothing to fill
  kernels::fill_columns(cpu, t, 3, 2.5);
  EXPECT_EQ(t.data<float>()[3], 2.5f);
  EXPECT_EQ(t.data<float>()[7], 2.5f);
  EXPECT_EQ(t.data<float>()[6], 0.0f);
  EXPECT_ERROR_CONTAINS(kernels::fill_columns(cpu, t, 5, 0.0), "'t'");
  EXPECT_ERROR_CONTAINS(kernels::fill_columns(cpu, t, -1, 0.0), "'t'");
}
