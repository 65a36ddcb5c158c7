// The cost model's FLOP counts against hand-derived formulas (every GEMM of a layer and the head,
// the causal attention's forward and FlashAttention-style backward), their split over tensor
// parallelism, what recompute adds, and the communication it charges.
#include "megaton/plan/chunk_costs.h"

#include <gtest/gtest.h>

#include "megaton/plan/collective_cost.h"
#include "megaton/plan/shipped_systems.h"
#include "megaton/train/pipeline_layout.h"

using namespace megaton;
using namespace megaton::plan;

namespace {

train::TrainConfig config(std::vector<std::string> sets, int64_t world) {
  sets.insert(sets.begin(), {"training.micro_batch_size=2", "training.seq_length=64", "training.global_batch_size=4"});
  train::TrainConfig c = train::load_train_config("", sets);
  train::resolve_parallel_layout(c, world);
  return c;
}

ChunkCost whole_model(const train::TrainConfig& c, const SystemSpec& s) {
  return chunk_cost(c, s, train::pipeline_layout(c), 0);
}

double total_flops(const ChunkCost& k) { return k.forward.flops + k.backward_input.flops + k.backward_weight.flops; }

}  // namespace

TEST(ChunkCosts, GptFlopsAreTheHandDerivedOnes) {
  const SystemSpec s = *shipped_system("h100");
  const train::TrainConfig c = config({}, 1);  // gpt-tiny: 4 layers, C 192, 6 heads of 32, ffn 768, vocab 257
  const double N = 128, C = 192, F = 768, V = 257, L = 4, seq = 64, d = 32, pairs = 2 * 6;
  const double layer_gemms = 2 * N * (4 * C * C + 2 * C * F);  // qkv, proj, fc1, fc2: one pass
  const double attention_fwd = pairs * seq * seq * 2 * d, attention_bwd = pairs * seq * seq * 5 * d;
  const ChunkCost k = whole_model(c, s);
  EXPECT_DOUBLE_EQ(k.forward.flops, L * (layer_gemms + attention_fwd) + 2 * (2 * N * V * C));  // head: logits and dx
  EXPECT_DOUBLE_EQ(k.backward_input.flops, L * (layer_gemms + attention_bwd));
  EXPECT_DOUBLE_EQ(k.backward_weight.flops, L * layer_gemms + 2 * N * V * C);
  // Megatron's 6ND for the matmuls (its attention term counts no backward recompute of the scores).
  const double matmul_params = L * (4 * C * C + 2 * C * F) + V * C;
  EXPECT_DOUBLE_EQ(total_flops(k) - L * (attention_fwd + attention_bwd), 6 * N * matmul_params);
  EXPECT_EQ(k.forward.comm_s, 0.0);  // one process: nothing to wait for
}

TEST(ChunkCosts, TensorParallelismSplitsEveryGemmAndChargesItsCollectives) {
  const SystemSpec s = *shipped_system("h100");
  const ChunkCost one = whole_model(config({}, 1), s);
  const train::TrainConfig c2 = config({"tp=2"}, 2);
  const ChunkCost two = whole_model(c2, s);
  const double N = 128, C = 192, head_one = 6 * N * 257 * C, head_two = 6 * N * (258.0 / 2) * C;
  EXPECT_DOUBLE_EQ(total_flops(two) - head_two, (total_flops(one) - head_one) / 2);
  // Without sequence parallelism: per layer two all-reduces of [N, C] forward (attention and MLP
  // outputs) and two backward (their inputs' gradients), the embedding's forward and the head's
  // input gradient.
  const double ar = collective_seconds(s, Collective::AllReduce, {2, 1}, N * C * 4);
  const double stats = collective_seconds(s, Collective::AllReduce, {2, 1}, 3 * N * 4);
  EXPECT_NEAR(two.forward.comm_s, 4 * 2 * ar + ar + stats, 1e-15);
  EXPECT_NEAR(two.backward_input.comm_s, 4 * 2 * ar + ar, 1e-15);
  // Sequence parallelism: all-gathers and reduce-scatters of the same tensors instead.
  const ChunkCost sp = whole_model(config({"tp=2", "parallel.sequence_parallel=true"}, 2), s);
  const double ag = collective_seconds(s, Collective::AllGather, {2, 1}, N * C * 4);
  const double rs = collective_seconds(s, Collective::ReduceScatter, {2, 1}, N * C * 4);
  EXPECT_NEAR(sp.forward.comm_s, 4 * 2 * (ag + rs) + rs + ag + stats, 1e-15);
}

TEST(ChunkCosts, FullRecomputeRunsEveryLayersForwardAgainInB) {
  const SystemSpec s = *shipped_system("h100");
  const ChunkCost none = whole_model(config({}, 1), s);
  const ChunkCost full = whole_model(config({"training.recompute_granularity=\"full\""}, 1), s);
  const double head_and_embedding_fwd = 2 * (2 * 128.0 * 257 * 192);
  EXPECT_DOUBLE_EQ(full.backward_input.flops, none.backward_input.flops + none.forward.flops - head_and_embedding_fwd);
  EXPECT_DOUBLE_EQ(full.forward.flops, none.forward.flops);
  const ChunkCost attn = whole_model(
      config({"training.recompute_granularity=\"selective\"", "training.recompute_modules=\"core_attn\""}, 1), s);
  EXPECT_DOUBLE_EQ(attn.backward_input.flops - none.backward_input.flops, 4 * 12 * 64.0 * 64 * 2 * 32);
}

TEST(ChunkCosts, MoeExpertsSplitOverExpertParallelRanksAndPayForTheirAllToAll) {
  const SystemSpec s = *shipped_system("h100");
  const std::vector<std::string> moe = {"model.preset=\"mixtral-tiny\""};
  const train::TrainConfig c1 = config(moe, 2), c2 = config({moe[0], "ep=2"}, 2);
  const ChunkCost one = whole_model(c1, s), two = whole_model(c2, s);
  // Balanced routing: each rank runs the same expert rows in all (half the experts, twice the rows
  // each), so the FLOPs match; the all-to-alls are extra time.
  EXPECT_DOUBLE_EQ(total_flops(one), total_flops(two));
  EXPECT_GT(two.forward.comm_s, 0.0);
  EXPECT_EQ(one.forward.comm_s, 0.0);
}

// The engine overlaps one token transfer per direction with the shared expert (the dispatch in F,
// the combine's backward in B) and waits for the other and for the forward's swap of the counts.
// mixtral-tiny: 4 MoE layers, C 192, top-2 of 8 experts; f32 tokens.
TEST(ChunkCosts, SharedExpertHidesOneTokenTransferPerDirection) {
  const SystemSpec s = *shipped_system("h100");
  const double layers = 4, slots = 2 * 64 * 2, C = 192;
  const GroupShape ep{2, 1};
  const double a2a = collective_seconds(s, Collective::AllToAll, ep, slots * C * 4.0);
  const double counts = collective_seconds(s, Collective::AllToAll, ep, 8.0 * 8);
  const std::vector<std::string> moe = {"model.preset=\"mixtral-tiny\"", "ep=2"};
  // No shared expert: both transfers of each direction are waited for.
  const ChunkCost bare = whole_model(config(moe, 2), s);
  EXPECT_NEAR(bare.forward.comm_s, layers * (counts + 2 * a2a), 1e-12);
  EXPECT_NEAR(bare.backward_input.comm_s, layers * 2 * a2a, 1e-12);
  // A shared expert far longer than a transfer hides exactly one of them.
  std::vector<std::string> shared = moe;
  shared.push_back("model.moe_shared_expert_intermediate_size=65536");
  const ChunkCost hidden = whole_model(config(shared, 2), s);
  EXPECT_NEAR(hidden.forward.comm_s, layers * (counts + a2a), 1e-12);
  EXPECT_NEAR(hidden.backward_input.comm_s, layers * a2a, 1e-12);
  // Without the overlap nothing hides.
  shared.push_back("model.moe_shared_expert_overlap=false");
  const ChunkCost waited = whole_model(config(shared, 2), s);
  EXPECT_NEAR(waited.forward.comm_s, layers * (counts + 2 * a2a), 1e-12);
}
