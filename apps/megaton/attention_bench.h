// `megaton bench --attention`: the causal attention kernel of a preset's shape (heads, kv heads, head
// dims; MLA presets attend with qk = nope + rope, v = v_head_dim) at batch x seq-len, forward and
// backward timed in isolation on the device, with fused QKV rows as the model lays them out. FLOPs
// follow FlashAttention's convention: the forward's two GEMMs (4 B Hq T^2 D, D the mean of the qk and
// v head dims) halved for the causal mask, the backward 2.5 times that. bench/torch_attention_compare.py
// times PyTorch's scaled_dot_product_attention on the same shapes.
#pragma once
#include <cstdint>

#include "megaton/core/device.h"
#include "megaton/core/dtype.h"
#include "megaton/models/transformer_config.h"

namespace megaton::app {

// One line (or one JSON object) per pass, forward and backward.
void print_attention_bench(const models::TransformerConfig& cfg, int64_t batch, int64_t seq_len, int repeats, bool json,
                           Device device, DType dtype);

}  // namespace megaton::app
