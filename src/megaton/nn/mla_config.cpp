#include "megaton/nn/mla_config.h"

#include "megaton/core/error.h"

namespace megaton::nn {

void MlaConfig::validate() const {
  auto in_range = [](const char* key, int64_t v, int64_t lo) {
    constexpr int64_t hi = int64_t{1} << 16;
    if (v < lo || v > hi) fail("model config: ", key, " must be in [", lo, ", ", hi, "], got ", v);
  };
  in_range("q_lora_rank", q_lora_rank, 0);
  in_range("kv_lora_rank", kv_lora_rank, 1);
  in_range("qk_head_dim", qk_head_dim, 1);
  in_range("qk_pos_emb_head_dim", qk_pos_emb_head_dim, 2);
  in_range("v_head_dim", v_head_dim, 1);
  if (qk_pos_emb_head_dim % 2 != 0)
    fail("model config: qk_pos_emb_head_dim must be even (rotary pairs), got ", qk_pos_emb_head_dim);
}

}  // namespace megaton::nn
