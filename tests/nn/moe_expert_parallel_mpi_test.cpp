// The MoE layer under expert parallelism (mpirun on 2 and 4 ranks, the whole world one expert-
// parallel group of 8 experts): every rank builds the whole layer and its expert-parallel one from
// the same global weights and runs both on its own tokens. The split layer must give each rank the
// whole layer's output and input gradient for those tokens, the router and shared expert the
// same gradients, and each rank's experts the gradient summed over every rank's tokens (what the
// whole layer gives when its per-rank gradients are summed): both dispatchers, with and without the
// shared-expert overlap, softmax top-2 and DeepSeek-style sigmoid group-limited routing with a shared
// expert and a capacity factor that drops tokens. Then the same under tensor parallelism (pairs of
// ranks, with and without sequence parallelism). Relative to the largest reference value, 1e-5,
// NaN failing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "../support/mpi_test_main.h"
#include "megaton/core/rng.h"
#include "megaton/nn/moe/moe_layer.h"
#include "megaton/nn/tensor_shards.h"
#include "megaton/parallel/tensor_parallel_mappings.h"

namespace megaton {
namespace {

parallel::Communicator& W() { return parallel::world(); }

Tensor random(Shape shape, uint64_t stream, const std::string& name) {
  Tensor t = Tensor::empty(std::move(shape), DType::F32, MemCategory::Other, name);
  fill_normal(t.data<float>(), t.numel(), Philox(17, stream), 0.0f, 0.5f);
  return t;
}

struct Case {
  std::string name, dispatcher;
  bool overlap, deepseek;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ExpertParallelMoe : public ::testing::TestWithParam<Case> {};

nn::MoeConfig config_of(const Case& k) {
  nn::MoeConfig c;
  c.num_moe_experts = 8;
  c.moe_ffn_hidden_size = 6;
  c.moe_token_dispatcher_type = k.dispatcher;
  c.moe_shared_expert_overlap = k.overlap;
  if (k.deepseek) {
    c.moe_router_topk = 3;
    c.moe_router_score_function = "sigmoid";
    c.moe_router_num_groups = 4;
    c.moe_router_group_topk = 2;
    c.moe_router_norm_topk_prob = true;
    c.moe_router_topk_scaling_factor = 2.5;
    c.moe_router_enable_expert_bias = true;
    c.moe_router_load_balancing_type = "seq_aux_loss";
    c.moe_aux_loss_coeff = 0.01;
    c.moe_shared_expert_intermediate_size = 10;
    c.moe_expert_capacity_factor = 1.0;  // drops: a rank's tokens crowd some experts
  } else {
    c.moe_aux_loss_coeff = 0.02;
    c.moe_z_loss_coeff = 0.001;
  }
  return c;
}

TEST_P(ExpertParallelMoe, MatchesTheWholeLayerOnEachRanksTokens) {
  const Case& k = GetParam();
  const nn::MoeConfig c = config_of(k);
  const int64_t C = 12, B = 2, T = 5, N = B * T;
  nn::MoeLayer whole("mlp", C, c), split("mlp", C, c, nn::ExpertParallel{&W()});
  ASSERT_EQ(split.fc1.value.size(0), whole.fc1.value.size(0) / W().size());
  nn::ParameterList wp, sp;
  whole.parameters(wp);
  split.parameters(sp);
  ASSERT_EQ(wp.size(), sp.size());
  uint64_t stream = 1;
  for (size_t i = 0; i < wp.size(); ++i) {
    wp[i]->value.copy_from(random(wp[i]->value.shape(), stream++, wp[i]->name));
    nn::slice_global(*sp[i], wp[i]->value, sp[i]->value);
  }
  // Every rank its own tokens (the streams differ by rank).
  const Tensor x = random({N, C}, 1000 + W().rank(), "x"), dy = random({N, C}, 2000 + W().rank(), "dy");
  auto cw = whole.new_ctx(), cs = split.new_ctx();
  const Tensor yw = whole.forward(*cw, x, B, T), ys = split.forward(*cs, x, B, T);
  testing::expect_close_on_rank(ys, yw, "output");
  EXPECT_EQ(split.stats().dropped, whole.stats().dropped);
  if (k.deepseek) {
    EXPECT_GT(W().all_reduce_scalar(static_cast<double>(whole.stats().dropped)), 0) << "no token dropped";
  }
  testing::expect_close_on_rank(split.backward_input(*cs, dy, B, T), whole.backward_input(*cw, dy, B, T), "input gradient");
  split.backward_weight(*cs);
  whole.backward_weight(*cw);
  for (size_t i = 0; i < wp.size(); ++i) {
    if (sp[i]->shard.group != nn::ParallelGroup::Expert) {  // replicated: this rank's tokens alone
      testing::expect_close_on_rank(sp[i]->grad, wp[i]->grad, sp[i]->name + " gradient");
      continue;
    }
    // A rank's experts learn from every rank's tokens.
    W().all_reduce(wp[i]->grad);
    testing::expect_close_on_rank(nn::gather_global(*sp[i], sp[i]->grad, nn::ShardGroups({}, nn::ExpertParallel{&W()})), wp[i]->grad,
                 sp[i]->name + " gradient");
  }
}

INSTANTIATE_TEST_SUITE_P(Dispatchers, ExpertParallelMoe,
                         ::testing::Values(Case{"alltoall", "alltoall", true, false},
                                           Case{"alltoall_no_overlap", "alltoall", false, true},
                                           Case{"alltoall_deepseek", "alltoall", true, true},
                                           Case{"allgather", "allgather", true, false},
                                           Case{"allgather_deepseek", "allgather", false, true}),
                         [](const auto& info) { return info.param.name; });

// Under tensor parallelism (pairs of consecutive ranks, expert tensor parallel size 1) with the
// whole world the expert-parallel group: a pair shares its tokens, each rank sends its block of
// them (its sequence-parallel rows with `sp`) to the experts, the router runs on all of them on both
// ranks. Outputs and input gradients are the whole layer's (the rank's rows with sp), the router's
// and the tensor-parallel shared expert's gradients the whole layer's on the pair's tokens, each
// expert's the sum over the pairs.
class TensorParallelMoe : public ::testing::TestWithParam<std::tuple<Case, bool>> {};

TEST_P(TensorParallelMoe, MatchesTheWholeLayerOnEachPairsTokens) {
  const Case& k = std::get<0>(GetParam());
  const bool sp = std::get<1>(GetParam());  // not a structured binding: the lambda below captures it
  const nn::MoeConfig c = config_of(k);
  const int64_t C = 12, B = 2, T = 6, N = B * T;
  const auto tp_group = W().split(W().rank() / 2, W().rank() % 2, "tp");
  const auto dp_group = W().split(W().rank() % 2, W().rank() / 2, "dp");  // the same tensor-parallel rank
  const nn::TensorParallel tp{tp_group.get(), sp};
  const nn::ShardGroups groups(tp, nn::ExpertParallel{&W()});
  nn::MoeLayer whole("mlp", C, c), split("mlp", C, c, groups.ep, tp);
  nn::ParameterList wp, sp_params;
  whole.parameters(wp);
  split.parameters(sp_params);
  ASSERT_EQ(wp.size(), sp_params.size());
  uint64_t stream = 1;
  for (size_t i = 0; i < wp.size(); ++i) {
    wp[i]->value.copy_from(random(wp[i]->value.shape(), stream++, wp[i]->name));
    nn::slice_global(*sp_params[i], wp[i]->value, sp_params[i]->value);
  }
  const int pair = W().rank() / 2;
  const Tensor x = random({N, C}, 1000 + pair, "x"), dy = random({N, C}, 2000 + pair, "dy");
  const auto mine = [&](const Tensor& t) { return sp ? parallel::scatter_rows(*tp.group, t, t.name()) : t; };
  auto cw = whole.new_ctx(), cs = split.new_ctx();
  const Tensor yw = whole.forward(*cw, x, B, T), ys = split.forward(*cs, mine(x), B, T);
  testing::expect_close_on_rank(ys, mine(yw), "output");
  EXPECT_EQ(split.stats().dropped, whole.stats().dropped);
  testing::expect_close_on_rank(split.backward_input(*cs, mine(dy), B, T), mine(whole.backward_input(*cw, dy, B, T)),
               "input gradient");
  split.backward_weight(*cs);
  whole.backward_weight(*cw);
  for (size_t i = 0; i < wp.size(); ++i) {
    if (sp_params[i]->shard.group == nn::ParallelGroup::Expert) dp_group->all_reduce(wp[i]->grad);
    testing::expect_close_on_rank(nn::gather_global(*sp_params[i], sp_params[i]->grad, groups), wp[i]->grad,
                 sp_params[i]->name + " gradient");
  }
}

INSTANTIATE_TEST_SUITE_P(Dispatchers, TensorParallelMoe,
                         ::testing::Combine(::testing::Values(Case{"alltoall", "alltoall", true, true},
                                                              Case{"allgather", "allgather", false, false}),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + (std::get<1>(info.param) ? "_sp" : "");
                         });

// An expert count the group does not divide is refused by name.
TEST(ExpertParallelMoeConfig, ExpertsNotDivisibleByTheGroup) {
  nn::MoeConfig c;
  c.num_moe_experts = W().size() + 1;
  c.moe_router_topk = 1;
  try {
    nn::MoeLayer layer("mlp", 4, c, nn::ExpertParallel{&W()});
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not divisible by expert_model_parallel_size"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace megaton

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!megaton::testing::launched_or_explain(argv[0])) return 1;
  return megaton::testing::run_tests_on_every_rank(megaton::parallel::world());
}
