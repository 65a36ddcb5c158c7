// The mixture-of-experts settings of a model, named as Megatron-LM's arguments (num_moe_experts,
// moe_router_topk, ...; norm_topk_prob and routed scaling as in DeepSeek-V3's HF config).
#pragma once
#include <cstdint>
#include <string>

#include "megaton/kernels/cpu/moe.h"

namespace megaton::nn {

struct MoeConfig {
  int64_t num_moe_experts = 8;
  int64_t moe_router_topk = 2;
  int64_t moe_ffn_hidden_size = 64;                  // each routed expert's SwiGLU width
  int64_t moe_shared_expert_intermediate_size = 0;  // 0: no shared expert
  std::string moe_router_score_function = "softmax";  // "softmax" | "sigmoid"
  bool moe_router_pre_softmax = true;  // softmax over all experts, then top-k (else softmax over the k)
  int64_t moe_router_num_groups = 1;   // group-limited routing (DeepSeek-V3's n_group)
  int64_t moe_router_group_topk = 1;   // eligible groups per token (topk_group)
  bool moe_router_norm_topk_prob = false;      // selected weights normalised to sum 1
  double moe_router_topk_scaling_factor = 1.0;  // routed_scaling_factor
  // "aux_loss" (Switch / GShard, over the micro-batch), "seq_aux_loss" (DeepSeek-V3, per sequence)
  // or "none"; weighted by moe_aux_loss_coeff.
  std::string moe_router_load_balancing_type = "aux_loss";
  double moe_aux_loss_coeff = 0.0;
  double moe_z_loss_coeff = 0.0;
  // Auxiliary-loss-free balancing: a per-expert bias added to the scores for selection only, moved
  // after each step by rate * sign(mean load - load).
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 1e-3;
  double moe_expert_capacity_factor = 0.0;       // 0: dropless; else capacity = ceil(factor * N * k / E)
  std::string moe_token_drop_policy = "probs";   // "probs" | "position": which over-capacity slots go
  // With expert parallelism: how tokens reach the experts' ranks ("alltoall" | "allgather",
  // nn/moe/token_dispatcher.h), and whether the shared expert computes while they travel (Megatron's
  // moe_shared_expert_overlap; on by default here, as it changes no number, only the time).
  std::string moe_token_dispatcher_type = "alltoall";
  bool moe_shared_expert_overlap = true;
  // The routed experts' GEMMs side by side in one parallel region (kernels/moe.h), or one after
  // another (false: Megatron's SequentialMLP, for comparison). The same results either way.
  bool moe_grouped_gemm = true;

  bool sigmoid() const { return moe_router_score_function == "sigmoid"; }
  kernels::cpu::RouterOptions router_options() const;
  // Throws naming the key and the accepted range for any value out of range.
  void validate() const;
};

}  // namespace megaton::nn
