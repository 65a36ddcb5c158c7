// `megaton bench --continuous-batching N`: N requests (random prompts of seq-len tokens, `steps`
// new tokens each, greedy, random weights) served by infer::ContinuousBatcher against the same
// requests generated one after another by infer::generate(), side by side in one run: aggregate
// generated tokens per second of each, their ratio, and the batcher's decode steps and KV pages.
#pragma once
#include <cstdint>

#include "megaton/core/dtype.h"
#include "megaton/models/transformer_config.h"

namespace megaton::app {

// kv_dtype: the batcher's KV pages (f32 or bf16); generate()'s contiguous cache is f32.
void print_batch_decode(const models::TransformerConfig& cfg, int64_t requests, int64_t prompt_tokens,
                        int64_t new_tokens, DType dtype, DType kv_dtype, bool json);

}  // namespace megaton::app
