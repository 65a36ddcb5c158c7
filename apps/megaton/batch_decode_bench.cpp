#include "batch_decode_bench.h"

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "megaton/core/rng.h"
#include "megaton/infer/continuous_batching.h"
#include "megaton/models/transformer_model.h"

namespace megaton::app {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void print_batch_decode(const models::TransformerConfig& cfg, int64_t requests, int64_t prompt_tokens,
                        int64_t new_tokens, DType dtype, DType kv_dtype, bool json) {
  models::TransformerModel model(cfg);
  model.init_weights(1);
  model.set_compute_dtype(dtype);
  Philox rng(11);
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(requests));
  uint64_t draw = 0;
  for (auto& p : prompts)
    for (int64_t i = 0; i < prompt_tokens; ++i)
      p.push_back(static_cast<int32_t>(rng.uniform_double(draw++) * static_cast<double>(cfg.vocab_size - 1)));
  infer::SamplingOptions o;
  o.temperature = 0;
  o.max_new_tokens = new_tokens;
  const std::vector<infer::SamplingOptions> sampling(static_cast<size_t>(requests), o);

  model.refresh_compute_weights();
  auto t0 = std::chrono::steady_clock::now();
  int64_t sequential_tokens = 0;
  for (const auto& p : prompts) sequential_tokens += static_cast<int64_t>(infer::generate(model, p, o).size());
  const double sequential_s = seconds_since(t0);

  const infer::BatchingOptions options{.max_running = requests, .kv_dtype = kv_dtype};
  infer::ContinuousBatcher batcher(model, options);
  t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> ids;
  for (const auto& p : prompts) ids.push_back(batcher.submit(p, o));
  int64_t max_pages = 0;
  while (batcher.step()) max_pages = std::max(max_pages, batcher.used_pages());
  const double batched_s = seconds_since(t0);
  int64_t batched_tokens = 0;
  for (const int64_t id : ids) batched_tokens += static_cast<int64_t>(batcher.output(id).size());

  const double seq_rate = static_cast<double>(sequential_tokens) / sequential_s;
  const double batch_rate = static_cast<double>(batched_tokens) / batched_s;
  if (json) {
    std::printf("%s\n", nlohmann::json{{"model", cfg.name},
                                       {"layers", cfg.num_layers},
                                       {"dtype", dtype_name(dtype)},
                                       {"kv_cache_dtype", dtype_name(kv_dtype)},
                                       {"requests", requests},
                                       {"prompt_tokens", prompt_tokens},
                                       {"new_tokens", new_tokens},
                                       {"sequential_tokens_per_s", seq_rate},
                                       {"batched_tokens_per_s", batch_rate},
                                       {"speedup", batch_rate / seq_rate},
                                       {"decode_steps", batcher.decode_steps()},
                                       {"max_kv_pages_used", max_pages},
                                       {"kv_pages", batcher.num_pages()},
                                       {"preemptions", batcher.preemptions()}}
                            .dump()
                            .c_str());
    return;
  }
  std::printf("%s (%ld layers, %s) %ld requests x (%ld prompt + %ld new tokens), greedy:\n", cfg.name.c_str(),
              static_cast<long>(cfg.num_layers), std::string(dtype_name(dtype)).c_str(), static_cast<long>(requests),
              static_cast<long>(prompt_tokens), static_cast<long>(new_tokens));
  std::printf("  one after another (generate):   %8.1f generated tokens/s (%.2f s)\n", seq_rate, sequential_s);
  std::printf(
      "  continuous batching:            %8.1f generated tokens/s (%.2f s, %ld decode steps, "
      "<= %ld of %ld %s KV pages, %ld preemptions)\n",
      batch_rate, batched_s, static_cast<long>(batcher.decode_steps()), static_cast<long>(max_pages),
      static_cast<long>(batcher.num_pages()), std::string(dtype_name(kv_dtype)).c_str(),
      static_cast<long>(batcher.preemptions()));
  std::printf("  speed-up: %.2fx\n", batch_rate / seq_rate);
}

}  // namespace megaton::app
