#include "megaton/nn/moe/moe_config.h"

#include <cmath>

#include "megaton/core/error.h"
#include "megaton/kernels/moe.h"

namespace megaton::nn {

kernels::cpu::RouterOptions MoeConfig::router_options() const {
  return {num_moe_experts,      moe_router_topk,         sigmoid(),
          moe_router_pre_softmax, moe_router_num_groups, moe_router_group_topk,
          moe_router_norm_topk_prob, moe_router_topk_scaling_factor};
}

void MoeConfig::validate() const {
  auto in_range = [](const char* key, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi) fail("model config: ", key, " must be in [", lo, ", ", hi, "], got ", v);
  };
  auto finite_at_least_zero = [](const char* key, double v) {
    if (!(std::isfinite(v) && v >= 0)) fail("model config: ", key, " must be finite and >= 0, got ", v);
  };
  in_range("moe_ffn_hidden_size", moe_ffn_hidden_size, 1, int64_t{1} << 24);
  in_range("moe_shared_expert_intermediate_size", moe_shared_expert_intermediate_size, 0, int64_t{1} << 24);
  if (moe_router_score_function != "softmax" && moe_router_score_function != "sigmoid")
    fail("model config: moe_router_score_function must be softmax or sigmoid, got '", moe_router_score_function, "'");
  if (moe_router_load_balancing_type != "aux_loss" && moe_router_load_balancing_type != "seq_aux_loss" &&
      moe_router_load_balancing_type != "none")
    fail("model config: moe_router_load_balancing_type must be aux_loss, seq_aux_loss or none, got '",
         moe_router_load_balancing_type, "'");
  if (moe_token_drop_policy != "probs" && moe_token_drop_policy != "position")
    fail("model config: moe_token_drop_policy must be probs or position, got '", moe_token_drop_policy, "'");
  if (moe_token_dispatcher_type != "alltoall" && moe_token_dispatcher_type != "allgather")
    fail("model config: moe_token_dispatcher_type must be alltoall or allgather, got '", moe_token_dispatcher_type, "'");
  finite_at_least_zero("moe_aux_loss_coeff", moe_aux_loss_coeff);
  finite_at_least_zero("moe_z_loss_coeff", moe_z_loss_coeff);
  finite_at_least_zero("moe_router_bias_update_rate", moe_router_bias_update_rate);
  finite_at_least_zero("moe_expert_capacity_factor", moe_expert_capacity_factor);
  try {
    kernels::check_router_options(router_options());
  } catch (const Error& e) {
    fail("model config: ", e.what());
  }
}

}  // namespace megaton::nn
