// Field-by-field comparison of two TransformerConfigs that names every field that differs. The
// structured bindings must name each data member, so adding a field to TransformerConfig (or
// RopeScaling) breaks this build until the field is listed here, and so compared everywhere.
#pragma once
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "megaton/models/transformer_config.h"

namespace megaton::testing {

// (field name, value printed exactly: doubles with 17 significant digits).
inline std::vector<std::pair<std::string, std::string>> config_fields(const models::TransformerConfig& c) {
  const auto& [name, num_layers, hidden_size, num_attention_heads, num_query_groups, kv_channels, ffn_hidden_size,
               vocab_size, make_vocab_size_divisible_by, max_position_embeddings, attention_type, mlp_type, mla, moe,
               first_k_dense_replace, mtp_num_layers, mtp_loss_scaling_factor, normalization, activation, position_embedding, rope_layout, rotary_base,
               rope_scaling, add_bias_linear, tie_embeddings, norm_epsilon, init_method_std] = c;
  const auto& [factor, low_freq_factor, high_freq_factor, original_max_position, yarn, beta_fast, beta_slow, mscale,
               mscale_all_dim] = rope_scaling;
  const auto& [q_lora_rank, kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim] = mla;
  const auto& [num_moe_experts, moe_router_topk, moe_ffn_hidden_size, moe_shared_expert_intermediate_size,
               moe_router_score_function, moe_router_pre_softmax, moe_router_num_groups, moe_router_group_topk,
               moe_router_norm_topk_prob, moe_router_topk_scaling_factor, moe_router_load_balancing_type,
               moe_aux_loss_coeff, moe_z_loss_coeff, moe_router_enable_expert_bias, moe_router_bias_update_rate,
               moe_expert_capacity_factor, moe_token_drop_policy, moe_token_dispatcher_type, moe_shared_expert_overlap, moe_grouped_gemm] = moe;
  auto str = [](auto v) {
    std::ostringstream out;
    out.precision(17);
    out << std::boolalpha << v;
    return out.str();
  };
  return {{"name", name},
          {"num_layers", str(num_layers)},
          {"hidden_size", str(hidden_size)},
          {"num_attention_heads", str(num_attention_heads)},
          {"num_query_groups", str(num_query_groups)},
          {"kv_channels", str(kv_channels)},
          {"ffn_hidden_size", str(ffn_hidden_size)},
          {"vocab_size", str(vocab_size)},
          {"make_vocab_size_divisible_by", str(make_vocab_size_divisible_by)},
          {"max_position_embeddings", str(max_position_embeddings)},
          {"attention_type", attention_type},
          {"mlp_type", mlp_type},
          {"mla.q_lora_rank", str(q_lora_rank)},
          {"mla.kv_lora_rank", str(kv_lora_rank)},
          {"mla.qk_head_dim", str(qk_head_dim)},
          {"mla.qk_pos_emb_head_dim", str(qk_pos_emb_head_dim)},
          {"mla.v_head_dim", str(v_head_dim)},
          {"moe.num_moe_experts", str(num_moe_experts)},
          {"moe.moe_router_topk", str(moe_router_topk)},
          {"moe.moe_ffn_hidden_size", str(moe_ffn_hidden_size)},
          {"moe.moe_shared_expert_intermediate_size", str(moe_shared_expert_intermediate_size)},
          {"moe.moe_router_score_function", moe_router_score_function},
          {"moe.moe_router_pre_softmax", str(moe_router_pre_softmax)},
          {"moe.moe_router_num_groups", str(moe_router_num_groups)},
          {"moe.moe_router_group_topk", str(moe_router_group_topk)},
          {"moe.moe_router_norm_topk_prob", str(moe_router_norm_topk_prob)},
          {"moe.moe_router_topk_scaling_factor", str(moe_router_topk_scaling_factor)},
          {"moe.moe_router_load_balancing_type", moe_router_load_balancing_type},
          {"moe.moe_aux_loss_coeff", str(moe_aux_loss_coeff)},
          {"moe.moe_z_loss_coeff", str(moe_z_loss_coeff)},
          {"moe.moe_router_enable_expert_bias", str(moe_router_enable_expert_bias)},
          {"moe.moe_router_bias_update_rate", str(moe_router_bias_update_rate)},
          {"moe.moe_expert_capacity_factor", str(moe_expert_capacity_factor)},
          {"moe.moe_token_drop_policy", moe_token_drop_policy},
          {"moe.moe_token_dispatcher_type", moe_token_dispatcher_type},
          {"moe.moe_shared_expert_overlap", str(moe_shared_expert_overlap)},
          {"moe.moe_grouped_gemm", str(moe_grouped_gemm)},
          {"first_k_dense_replace", str(first_k_dense_replace)},
          {"mtp_num_layers", str(mtp_num_layers)},
          {"mtp_loss_scaling_factor", str(mtp_loss_scaling_factor)},
          {"normalization", models::normalization_name(normalization)},
          {"activation", models::activation_name(activation)},
          {"position_embedding", models::position_embedding_name(position_embedding)},
          {"rope_layout", rope_layout == kernels::RopeLayout::Half ? "half" : "interleaved"},
          {"rotary_base", str(rotary_base)},
          {"rope_scaling.factor", str(factor)},
          {"rope_scaling.low_freq_factor", str(low_freq_factor)},
          {"rope_scaling.high_freq_factor", str(high_freq_factor)},
          {"rope_scaling.original_max_position", str(original_max_position)},
          {"rope_scaling.yarn", str(yarn)},
          {"rope_scaling.beta_fast", str(beta_fast)},
          {"rope_scaling.beta_slow", str(beta_slow)},
          {"rope_scaling.mscale", str(mscale)},
          {"rope_scaling.mscale_all_dim", str(mscale_all_dim)},
          {"add_bias_linear", str(add_bias_linear)},
          {"tie_embeddings", str(tie_embeddings)},
          {"norm_epsilon", str(norm_epsilon)},
          {"init_method_std", str(init_method_std)}};
}

//   EXPECT_TRUE(same_config(loaded, expected));
inline ::testing::AssertionResult same_config(const models::TransformerConfig& got,
                                              const models::TransformerConfig& want) {
  const auto a = config_fields(got), b = config_fields(want);
  std::string diff;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].second != b[i].second) diff += "\n  " + a[i].first + ": " + a[i].second + ", expected " + b[i].second;
  if (diff.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "configs differ in" << diff;
}

}  // namespace megaton::testing
