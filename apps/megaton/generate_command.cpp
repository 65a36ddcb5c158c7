#include <cstdio>
#include <vector>

#include "commands.h"
#include "option_range.h"
#include "megaton/core/threads.h"
#include "megaton/data/tokenizer.h"
#include "megaton/infer/generate.h"
#include "megaton/models/hf_format.h"

namespace megaton::app {

void add_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Generate text from an HF-format model (greedy or sampled)");
  static std::string model_dir, prompt, tokenizer = "byte";
  static infer::SamplingOptions opts;
  static int threads = 0;
  cmd->add_option("--model", model_dir, "HF model folder (config.json + model.safetensors)")->required();
  cmd->add_option("--prompt", prompt, "Prompt text")->required();
  cmd->add_option("--tokenizer", tokenizer, "Tokenizer spec")->capture_default_str();
  cmd->add_option("--max-new-tokens", opts.max_new_tokens, "Tokens to generate")->capture_default_str()->check(in_range<int64_t>(1));
  cmd->add_option("--temperature", opts.temperature, "Sampling temperature; 0 = greedy")->capture_default_str()
      ->check(in_range(0.0));
  cmd->add_option("--top-k", opts.top_k, "Keep the k most likely tokens (0 = all)")->capture_default_str()
      ->check(in_range<int64_t>(0));
  cmd->add_option("--top-p", opts.top_p, "Nucleus sampling: smallest set with this probability mass")->capture_default_str()
      ->check(in_range(0.0, 1.0));
  cmd->add_option("--seed", opts.seed, "Sampling seed")->capture_default_str()->check(in_range<uint64_t>(0));
  cmd->add_option("--threads", threads, "CPU threads")->check(in_range(0, 4096));
  cmd->callback([] {
    set_num_threads(threads);
    auto model = models::load_hf_model(model_dir);
    auto tok = data::make_tokenizer(tokenizer);
    if (tok->vocab_size() > model->config().vocab_size)
      fail("--tokenizer ", tokenizer, " has ", tok->vocab_size(), " ids but the model's vocab_size is ",
           model->config().vocab_size);
    opts.stop_token = tok->eod();
    std::fputs(prompt.c_str(), stdout);
    // Stream by decoding the whole continuation and printing what is new: a token decoded alone can
    // lose context (SentencePiece's leading space, a UTF-8 character split across byte tokens).
    std::vector<int32_t> generated;
    size_t printed = 0;
    infer::generate(*model, tok->encode(prompt), opts, [&](int32_t id) {
      generated.push_back(id);
      const std::string text = tok->decode(generated);
      if (text.size() <= printed) return;
      std::fwrite(text.data() + printed, 1, text.size() - printed, stdout);
      printed = text.size();
      std::fflush(stdout);
    });
    std::fputc('\n', stdout);
  });
}

}  // namespace megaton::app
