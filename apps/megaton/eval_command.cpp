#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "option_range.h"
#include "megaton/ckpt/safetensors.h"
#include "megaton/core/threads.h"
#include "megaton/data/token_stream.h"
#include "megaton/models/hf_format.h"
#include "megaton/train/evaluate.h"

namespace megaton::app {

void add_eval_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval", "Mean cross-entropy of an HF-format model on a Megatron dataset; prints "
                                         "{\"loss\": L, \"tokens\": N}");
  static std::string model_dir, data_prefix, dump;
  static int64_t seq_len = 0, max_samples = 0, batch = 8;
  static int threads = 0;
  cmd->add_option("--model", model_dir, "HF model folder (config.json + model.safetensors)")->required();
  cmd->add_option("--data", data_prefix, "Megatron dataset prefix (PREFIX.bin / PREFIX.idx)")->required();
  cmd->add_option("--seq-len", seq_len, "Sample length T: sample i is tokens [i*T, i*T+T] of the stream")
      ->required()
      ->check(in_range<int64_t>(1));
  cmd->add_option("--max-samples", max_samples, "Evaluate at most this many samples (default: all)")
      ->check(in_range<int64_t>(1));
  cmd->add_option("--batch", batch, "Samples per forward pass")->check(in_range<int64_t>(1, 1 << 20));
  cmd->add_option("--threads", threads, "CPU threads (default: OMP_NUM_THREADS or all cores)")->check(in_range(0, 4096));
  cmd->add_option("--dump-grads", dump,
                  "Also write the gradient of the loss for every parameter (HF names) to this safetensors file");
  cmd->callback([] {
    set_num_threads(threads);
    auto model = models::load_hf_model(model_dir);
    if (seq_len > model->config().max_position_embeddings)
      fail("--seq-len ", seq_len, " exceeds the model's max_position_embeddings ",
           model->config().max_position_embeddings);
    data::StreamSamples samples(std::make_shared<data::TokenStream>(data_prefix), seq_len);
    auto r = train::evaluate(*model, samples, batch, max_samples, !dump.empty());
    // A model that scores NaN or Inf is broken (diverged weights, overflow): a failure, not a number.
    if (!std::isfinite(r.loss))
      fail("model '", model_dir, "' gives a non-finite loss (", r.loss, ") on ", data_prefix, " over ", r.tokens,
           " tokens: its weights are diverged or overflow");
    if (!dump.empty())
      ckpt::save_safetensors(dump, models::to_hf_tensors(*model, true), {{"loss", std::to_string(r.loss)}});
    std::printf("%s\n", nlohmann::json{{"loss", r.loss}, {"tokens", r.tokens}}.dump().c_str());
  });
}

}  // namespace megaton::app
