// Tensor-parallel modules under mpirun (2 and 4 ranks, the whole world one tensor-parallel group):
// every rank builds the unsharded module and its own shard of the split one from the same global
// weights, runs both on the same inputs, and checks that the split one gives the unsharded outputs,
// input gradients and (gathered) weight gradients: Megatron's column- and row-parallel linears with
// and without sequence parallelism, the vocab-parallel output layer and cross-entropy with a padded
// vocabulary, and whole GPT / Llama models (GQA with kv heads split or replicated) and a DeepSeek-shaped
// one (multi-latent attention over split heads, an MTP depth). Comparisons
// are relative to the largest reference value, 1e-5, NaN failing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "../support/mpi_test_main.h"
#include "../support/tiny_model.h"
#include "megaton/core/rng.h"
#include "megaton/models/parallel_weights.h"
#include "megaton/nn/linear.h"
#include "megaton/nn/output_head.h"
#include "megaton/nn/tensor_shards.h"
#include "megaton/parallel/tensor_parallel_mappings.h"

namespace megaton {
namespace {

parallel::Communicator& W() { return parallel::world(); }

Tensor random(Shape shape, uint64_t stream, const std::string& name) {
  Tensor t = Tensor::empty(std::move(shape), DType::F32, MemCategory::Other, name);
  fill_normal(t.data<float>(), t.numel(), Philox(11, stream), 0.0f, 1.0f);
  return t;
}

// This rank's rows of t (the sequence-parallel split).
Tensor my_rows(const Tensor& t) { return parallel::scatter_rows(W(), t, t.name()); }

// The split parameter's gradient, gathered, against the whole one's.
void expect_same_grad(const nn::Parameter& split, const nn::Parameter& whole, const nn::TensorParallel& tp) {
  nn::sum_shared_grads(split, tp);
  testing::expect_close_on_rank(nn::gather_global(split, split.grad, tp), whole.grad, split.name + " gradient");
}

void set_from_global(nn::Parameter& split, const nn::Parameter& whole) { nn::slice_global(split, whole.value, split.value); }

class ParallelLinears : public ::testing::TestWithParam<bool> {};

// Column-parallel then row-parallel (the attention / MLP pair): y = (x A^T + a) B^T + b.
TEST_P(ParallelLinears, ColumnThenRowMatchTheUnsplitPair) {
  const bool sp = GetParam();
  const nn::TensorParallel tp{&W(), sp};
  const int64_t N = 8, in = 12, mid = 16, out = 12;
  nn::Linear a("a", in, mid, true, nn::LinearParallel::Column), b("b", mid, out, true, nn::LinearParallel::Row);
  nn::Linear as("a", in, mid, true, nn::LinearParallel::Column, tp), bs("b", mid, out, true, nn::LinearParallel::Row, tp);
  uint64_t stream = 1;
  for (nn::Parameter* p : {&a.weight, &a.bias, &b.weight, &b.bias}) p->value.copy_from(random(p->value.shape(), stream++, p->name));
  for (auto [s, w] : {std::pair{&as.weight, &a.weight}, {&as.bias, &a.bias}, {&bs.weight, &b.weight}, {&bs.bias, &b.bias}})
    set_from_global(*s, *w);
  EXPECT_EQ(as.out_features(), mid / W().size());
  EXPECT_EQ(bs.in_features(), mid / W().size());
  const Tensor x = random({N, in}, 100, "x"), dy = random({N, out}, 101, "dy");
  nn::LinearCtx ca, cb, sa, sb;
  const Tensor y = b.forward(cb, a.forward(ca, x));
  const Tensor dx = a.backward_input(ca, b.backward_input(cb, dy));
  b.backward_weight(cb);
  a.backward_weight(ca);
  // Under sequence parallelism each rank holds its rows of x and of dy, and gets its rows back.
  const Tensor ys = bs.forward(sb, as.forward(sa, sp ? my_rows(x) : x));
  const Tensor dxs = as.backward_input(sa, bs.backward_input(sb, sp ? my_rows(dy) : dy));
  bs.backward_weight(sb);
  as.backward_weight(sa);
  testing::expect_close_on_rank(ys, sp ? my_rows(y) : y, "output");
  testing::expect_close_on_rank(dxs, sp ? my_rows(dx) : dx, "input gradient");
  for (auto [s, w] : {std::pair{&as.weight, &a.weight}, {&as.bias, &a.bias}, {&bs.weight, &b.weight}, {&bs.bias, &b.bias}})
    expect_same_grad(*s, *w, tp);
}

INSTANTIATE_TEST_SUITE_P(Sequence, ParallelLinears, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "sequence_parallel" : "plain"; });

class VocabParallelLoss : public ::testing::TestWithParam<bool> {};

// The output layer + cross-entropy over a vocabulary of 37 padded to a multiple of 4 x tp: the same
// loss, input gradient and weight gradient as the unsplit head, padding excluded from the softmax.
TEST_P(VocabParallelLoss, MatchesTheUnsplitHead) {
  const bool sp = GetParam();
  const nn::TensorParallel tp{&W(), sp};
  const int64_t N = 8, hidden = 12, vocab = 37, padded = (vocab + 4 * W().size() - 1) / (4 * W().size()) * (4 * W().size());
  nn::OutputHead whole(hidden, vocab, vocab, nullptr), split(hidden, vocab, padded, nullptr, tp);
  nn::ParameterList wp, spl;
  whole.parameters(wp);
  split.parameters(spl);
  wp[0]->value.copy_from(random(wp[0]->value.shape(), 7, "w"));
  set_from_global(*spl[0], *wp[0]);
  // Padding rows get weights too (large ones): they must not change anything.
  if (split.weight().shard.rank == W().size() - 1) {
    const int64_t rows = split.weight().value.size(0), real = vocab - split.weight().shard.mine()[0].start;
    float* v = split.weight().value.data<float>();
    std::fill(v + real * hidden, v + rows * hidden, 50.0f);
  }
  const Tensor x = random({N, hidden}, 8, "x");
  Tensor targets = Tensor::empty({N}, DType::I32, MemCategory::Other, "targets");
  for (int64_t n = 0; n < N; ++n) targets.data<int32_t>()[n] = static_cast<int32_t>((n * 11 + 3) % vocab);
  targets.data<int32_t>()[2] = -100;  // ignored
  Tensor dx, dxs;
  const nn::LossSum l = whole.loss_and_grad(x, targets, 0.5f, dx);
  const nn::LossSum ls = split.loss_and_grad(sp ? my_rows(x) : x, targets, 0.5f, dxs);
  EXPECT_EQ(ls.count, l.count);
  EXPECT_NEAR(ls.sum, l.sum, 1e-5 * std::abs(l.sum));
  testing::expect_close_on_rank(dxs, sp ? my_rows(dx) : dx, "input gradient");
  // Only the real rows: the padding's gradient is zero, the unsplit head has none.
  const Tensor g = nn::gather_global(split.weight(), split.weight().grad, tp);
  testing::expect_close_on_rank(g, whole.weight().grad, "weight gradient");
  // (EXPECT, not ASSERT, before a collective: a rank leaving the test early would hang the others.)
  if (split.weight().shard.rank == W().size() - 1) {
    const int64_t rows = split.weight().value.size(0), real = vocab - split.weight().shard.mine()[0].start;
    int64_t nonzero = 0;
    for (int64_t i = real * hidden; i < rows * hidden; ++i) nonzero += split.weight().grad.data<float>()[i] != 0.0f;
    EXPECT_EQ(nonzero, 0) << "padding rows with a gradient";
  }
  const nn::LossSum eval = split.loss(sp ? my_rows(x) : x, targets);
  EXPECT_NEAR(eval.sum, l.sum, 1e-5 * std::abs(l.sum));
}

INSTANTIATE_TEST_SUITE_P(Sequence, VocabParallelLoss, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "sequence_parallel" : "plain"; });

struct ModelCase {
  std::string preset;
  int64_t groups;
  bool sp;
};

class SplitModels : public ::testing::TestWithParam<ModelCase> {};

// A whole model and its split over the world, initialised from the same seed: the shards are the
// slices of the whole model's weights; one forward / backward gives the same loss and gradients.
TEST_P(SplitModels, TrainLikeTheWholeModel) {
  const ModelCase& mc = GetParam();
  models::TransformerConfig c = testing::tiny_config(mc.preset);
  c.num_attention_heads = 4;
  c.num_query_groups = mc.groups;
  c.ffn_hidden_size = 64;
  if (c.mlp_type == "moe") c.mlp_type = "dense";  // MoE layers refuse tensor parallelism (expert tp: not built)
  if (mc.sp) c.mtp_num_layers = 0;                // MTP refuses sequence parallelism
  const nn::TensorParallel tp{&W(), mc.sp};
  models::TransformerModel whole(c), split(c, 1, tp);
  whole.init_weights(5);
  split.init_weights(5);
  for (size_t i = 0; i < whole.parameters().size(); ++i) {
    const nn::Parameter& s = *split.parameters()[i];
    const Tensor g = nn::gather_global(s, s.value, tp);
    const Tensor& w = whole.parameters()[i]->value;
    EXPECT_TRUE(g.nbytes() == w.nbytes() && std::memcmp(g.raw(), w.raw(), g.nbytes()) == 0)
        << s.name << " init is not the slice of the whole one";
  }
  const auto [tokens, targets] = testing::tiny_batch(2, 8);
  models::ModelCtx cw, cs;
  const double lw = whole.forward(cw, tokens, targets, true).loss;
  whole.backward(cw);
  const double ls = split.forward(cs, tokens, targets, true).loss;
  split.backward(cs);
  EXPECT_NEAR(ls, lw, 1e-5 * lw);
  for (size_t i = 0; i < whole.parameters().size(); ++i)
    expect_same_grad(*split.parameters()[i], *whole.parameters()[i], tp);
  // Gathered back, the split model is the whole one.
  const auto gathered = models::gather_whole_model(split);
  for (size_t i = 0; i < whole.parameters().size(); ++i)
    testing::expect_close_on_rank(gathered->parameters()[i]->value, whole.parameters()[i]->value, whole.parameters()[i]->name);
}

INSTANTIATE_TEST_SUITE_P(Models, SplitModels,
                         ::testing::Values(ModelCase{"gpt-tiny", 4, false}, ModelCase{"gpt-tiny", 4, true},
                                           ModelCase{"llama-tiny", 4, false}, ModelCase{"llama-tiny", 2, true},
                                           ModelCase{"llama-tiny", 1, true},
                                           // MLA (heads split, latents replicated) and an MTP depth
                                           ModelCase{"deepseek-v3-tiny", 4, false}, ModelCase{"deepseek-v3-tiny", 4, true}),
                         [](const auto& info) {
                           return info.param.preset.substr(0, info.param.preset.find('-')) +
                                  "_groups" + std::to_string(info.param.groups) + (info.param.sp ? "_sp" : "");
                         });

}  // namespace
}  // namespace megaton

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!megaton::testing::launched_or_explain(argv[0])) return 1;
  return megaton::testing::run_tests_on_every_rank(megaton::parallel::world());
}
