// A tiny MoE model (a dense layer, then an MoE layer with a shared expert, grouped sigmoid routing,
// sequence aux loss and the auxiliary-loss-free expert bias) trained by `mpirun -np 2 megaton train`
// at dp2 and pp2 like one process: losses and grad norms within 1e-5, final weights (the expert
// bias included) within 1e-5. At pp2 the MoE layer lives on the second stage alone, whose bias
// the checkpoint and export gather from it (planted earlier, when every stage held the whole model:
// the bias update left out of the pipeline group; the pp2 bias then differed, caught).
#include <gtest/gtest.h>

#include "tiny_run.h"

using megaton::testing::Metrics;
using megaton::testing::TinyRunDir;

TEST(MoeParallelRuns, DataAndPipelineParallelTrainLikeOneProcess) {
  TinyRunDir run("llama-tiny");
  const std::string moe =
      "--set model.mlp_type=moe --set model.first_k_dense_replace=1 --set model.num_moe_experts=4 "
      "--set model.moe_router_topk=2 --set model.moe_ffn_hidden_size=32 "
      "--set model.moe_shared_expert_intermediate_size=32 --set model.moe_router_score_function=sigmoid "
      "--set model.moe_router_num_groups=2 --set model.moe_router_group_topk=1 "
      "--set model.moe_router_norm_topk_prob=true --set model.moe_router_load_balancing_type=seq_aux_loss "
      "--set model.moe_aux_loss_coeff=0.01 --set model.moe_router_enable_expert_bias=true "
      "--set model.moe_router_bias_update_rate=0.001 --set training.train_iters=7 --set logging.save_interval=0 ";
  const Metrics single = run.train_ok("single", moe);
  // The router starts almost uniform, so the bias flips each step between over- and under-loaded
  // experts: after an odd number of steps none is back at 0.
  const auto weights = megaton::testing::final_weights(run.run_dir("single"));
  const megaton::Tensor& bias = weights.at("model.layers.1.mlp.gate.e_score_correction_bias");
  for (int64_t e = 0; e < bias.numel(); ++e) ASSERT_NE(bias.data<float>()[e], 0.0f) << "expert " << e << " never moved";
  for (const megaton::testing::MpiVariant& v : std::vector<megaton::testing::MpiVariant>{
           {"dp2", 2, "", "data parallel 2 ranks"}, {"pp2", 2, "--set pp=2", "pipeline parallel 2 stages"}}) {
    const Metrics got = run.train_mpi_ok(v.np, v.name, moe + v.args, v.banner);
    megaton::testing::expect_close_training(got, single, run.run_dir(v.name), run.run_dir("single"), v.name);
  }
}

// DeepSeek-V3's shape: MLA, MoE layers and a multi-token prediction depth whose block is MoE too,
// at dp2 with gradient buckets reduced while backward runs: the MTP depth adds to the embedding's
// and head's gradients during the loss op, and the buckets must wait for those (their `uses`).
// Pipelining is refused by name (MTP needs the whole model on one stage).
TEST(MoeParallelRuns, DeepSeekWithMtpTrainsAtDataParallelLikeOneProcess) {
  TinyRunDir run("deepseek-v3-tiny");
  const std::string args = "--set training.train_iters=7 --set logging.save_interval=0 "
                           "--set parallel.overlap_grad_reduce=true --set parallel.bucket_size=20000 ";
  const Metrics single = run.train_ok("single", args);
  for (const auto& step : single.steps) ASSERT_TRUE(step.contains("mtp_loss")) << step.dump();
  const Metrics got = run.train_mpi_ok(2, "dp2", args, "data parallel 2 ranks");
  megaton::testing::expect_close_training(got, single, run.run_dir("dp2"), run.run_dir("single"), "dp2");
  const auto refused = run.train_mpi(2, "pp2", args + "--set pp=2");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("multi-token prediction needs the whole model"), std::string::npos) << refused.output;
}
