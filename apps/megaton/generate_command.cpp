#include <cstdio>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "inference_model.h"
#include "option_range.h"
#include "megaton/core/threads.h"
#include "megaton/data/tokenizer.h"
#include "megaton/infer/generate.h"
#include "megaton/infer/speculative.h"
#include "megaton/infer/text_stream.h"

namespace megaton::app {
namespace {

std::string model_dir, prompt, tokenizer = "byte";
std::vector<int32_t> prompt_ids;
infer::SamplingOptions opts;
int threads = 0;
bool json = false;
bool speculative = false, ignore_eos = false;
std::string mla_decode = "absorbed", draft_dir;
int64_t draft_tokens = 4;
std::unique_ptr<models::TransformerModel> draft_model;

// Greedy generation, with the model's MTP draft when --speculative asks or a draft model's proposals
// with --draft-model (the same tokens, fewer main-model steps); spec counts the drafts.
std::vector<int32_t> run(models::TransformerModel& model, const std::vector<int32_t>& input,
                         const infer::TokenCallback& on_token, infer::GenerateStats* stats,
                         infer::SpeculativeStats* spec) {
  if (speculative) return infer::generate_speculative(model, input, opts, on_token, stats, spec);
  if (draft_model)
    return infer::generate_with_draft(model, *draft_model, input, opts, draft_tokens, on_token, stats, spec);
  return infer::generate(model, input, opts, on_token, stats);
}
std::string precision = "fp32", weights_dtype = "auto", kv_cache_dtype = "auto";

// --kv-cache-dtype on a loaded model (auto: the model's own choice, bf16 under --precision bf16).
void set_kv_cache(models::TransformerModel& model) {
  if (kv_cache_dtype != "auto") model.set_kv_cache_dtype(kv_cache_dtype == "bf16" ? DType::BF16 : DType::F32);
}

// Tokens per second, or null when nothing was timed (e.g. the first token was the stop token).
nlohmann::json rate(int64_t tokens, double seconds) {
  return tokens > 0 && seconds > 0 ? nlohmann::json(static_cast<double>(tokens) / seconds) : nlohmann::json();
}

void print_json(models::TransformerModel& model, const data::Tokenizer& tok, const std::vector<int32_t>& input,
                double load_s) {
  infer::GenerateStats stats;
  infer::SpeculativeStats spec;
  nlohmann::json logprobs = nlohmann::json::array();
  const auto log = [&](const infer::GeneratedToken& t) {
    nlohmann::json top = nlohmann::json::array();
    for (const infer::TokenLogprob& alt : t.top) top.push_back({{"id", alt.id}, {"logprob", alt.logprob}});
    logprobs.push_back({{"id", t.id}, {"logprob", t.logprob}, {"top", top}});
    return true;
  };
  const std::vector<int32_t> ids =
      run(model, input, opts.logprobs >= 0 ? infer::TokenCallback(log) : nullptr, &stats, &spec);
  nlohmann::json out = {{"load_s", load_s},
                        {"prompt_tokens", stats.prefill_tokens},
                        {"prefill_s", stats.prefill_s},
                        {"prefill_tokens_per_s", rate(stats.prefill_tokens, stats.prefill_s)},
                        {"decode_tokens", stats.decode_tokens},
                        {"decode_s", stats.decode_s},
                        {"decode_tokens_per_s", rate(stats.decode_tokens, stats.decode_s)},
                        {"threads", num_threads()},
                        {"precision", precision},
                        {"weights_dtype", weights_dtype},
                        {"kv_cache_dtype", dtype_name(model.kv_cache_dtype())},
                        {"text", tok.decode(ids)},
                        {"ids", ids}};
  if (opts.logprobs >= 0) out["logprobs"] = logprobs;
  if (speculative || draft_model)
    out["speculative"] = {{"drafted", spec.drafted},
                          {"accepted", spec.accepted},
                          {"acceptance_rate", spec.drafted > 0 ? nlohmann::json(static_cast<double>(spec.accepted) /
                                                                                static_cast<double>(spec.drafted))
                                                               : nlohmann::json()},
                          {"main_steps", spec.main_steps}};
  // A byte-level continuation may end inside a UTF-8 character: replace, never throw.
  std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Generate text from an HF-format model (greedy or sampled)");
  cmd->add_option("--model", model_dir, "HF model folder (config.json + model.safetensors)")->required();
  auto* text_opt = cmd->add_option("--prompt", prompt, "Prompt text");
  // Ids as another tool sees them (llama2.c's run.c starts from a lone BOS, id 1, which no text encodes to).
  auto* ids_opt = cmd->add_option("--prompt-ids", prompt_ids, "Prompt as comma-separated token ids, instead of --prompt")
                      ->delimiter(',')
                      ->check(in_range<int32_t>(0));
  text_opt->excludes(ids_opt);
  cmd->add_option("--tokenizer", tokenizer, "Tokenizer spec")->capture_default_str();
  cmd->add_option("--max-new-tokens", opts.max_new_tokens, "Tokens to generate")->capture_default_str()->check(in_range<int64_t>(1));
  cmd->add_option("--temperature", opts.temperature, "Sampling temperature; 0 = greedy")->capture_default_str()
      ->check(in_range(0.0));
  cmd->add_option("--top-k", opts.top_k, "Keep the k most likely tokens (0 = all)")->capture_default_str()
      ->check(in_range<int64_t>(0));
  cmd->add_option("--top-p", opts.top_p, "Nucleus sampling: smallest set with this probability mass")->capture_default_str()
      ->check(in_range(0.0, 1.0));
  cmd->add_option("--min-p", opts.min_p, "Drop tokens less likely than this fraction of the most likely one (0 = off)")
      ->capture_default_str()->check(in_range(0.0, 1.0));
  cmd->add_option("--repetition-penalty", opts.repetition_penalty,
                  "Divide positive / multiply negative logits of tokens already seen (1 = off)")
      ->capture_default_str()->check(in_range(0.01, 100.0));
  cmd->add_option("--presence-penalty", opts.presence_penalty, "Subtract from the logits of tokens generated (0 = off)")
      ->capture_default_str()->check(in_range(-2.0, 2.0));
  cmd->add_option("--frequency-penalty", opts.frequency_penalty,
                  "Subtract this times the count from the logits of tokens generated (0 = off)")
      ->capture_default_str()->check(in_range(-2.0, 2.0));
  cmd->add_option("--logprobs", opts.logprobs,
                  "With --json: each generated token's log-probability and the N most likely ids' (0 .. 20)")
      ->check(in_range<int64_t>(0, infer::kMaxTopLogprobs));
  cmd->add_option("--seed", opts.seed, "Sampling seed")->capture_default_str()->check(in_range<uint64_t>(0));
  cmd->add_option("--threads", threads, "CPU threads")->check(in_range(0, 4096));
  add_inference_dtype_options(cmd, precision, weights_dtype);
  cmd->add_option("--kv-cache-dtype", kv_cache_dtype,
                  "The KV cache's dtype: f32, or bf16 (half the bytes each decode step reads, keys and values rounded "
                  "to bf16 as they are cached; the attention's math stays in the activations' dtype). auto: bf16 "
                  "under --precision bf16, else f32. MLA's latent cache stays f32")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
  cmd->add_option("--mla-decode", mla_decode,
                  "Multi-latent attention's decoding form: absorbed (W_uk and W_uv folded, attention over the latent "
                  "cache) or naive (the cached latent expanded into every head's keys and values each step; to compare)")
      ->capture_default_str()
      ->check(CLI::IsMember({"absorbed", "naive"}));
  cmd->add_flag("--speculative", speculative,
                "Greedy decoding with the model's multi-token prediction layer drafting each next token (DeepSeek-V3 "
                "folders with num_nextn_predict_layers): the same tokens as plain greedy, fewer main-model steps");
  auto* draft_opt = cmd->add_option("--draft-model", draft_dir,
                                    "Greedy speculative decoding with this smaller HF model (same vocabulary) proposing "
                                    "--draft-tokens tokens per main-model step: the same tokens as plain greedy");
  draft_opt->excludes(cmd->get_option("--speculative"));
  cmd->add_option("--draft-tokens", draft_tokens, "Tokens the draft model proposes per main-model step")
      ->capture_default_str()
      ->check(in_range<int64_t>(1, 64));
  cmd->add_flag("--ignore-eos", ignore_eos,
                "Go on past the tokenizer's end-of-document token to --max-new-tokens (benchmarks: a fixed length)");
  cmd->add_flag("--json", json,
                "Print one JSON object instead of streaming text: load_s, prompt and generated token counts, "
                "prefill_tokens_per_s, decode_tokens_per_s, text, ids");
  cmd->callback([text_opt, ids_opt] {
    if (text_opt->count() == 0 && ids_opt->count() == 0) fail("generate needs --prompt TEXT or --prompt-ids IDS");
    set_num_threads(threads);
    InferenceModel loaded = load_inference_model(model_dir, tokenizer, precision, weights_dtype);
    auto& model = loaded.model;
    auto& tok = loaded.tokenizer;
    set_kv_cache(*model);
    for (auto& layer : model->layers())
      if (auto* mla = dynamic_cast<nn::MultiLatentAttention*>(layer->attention.get()))
        mla->set_naive_decode(mla_decode == "naive");
    for (int32_t id : prompt_ids)
      if (id >= model->config().vocab_size)
        fail("--prompt-ids: id ", id, " is out of range: the model's vocab_size is ", model->config().vocab_size);
    const std::vector<int32_t> input = prompt_ids.empty() ? tok->encode(prompt) : prompt_ids;
    opts.stop_token = ignore_eos ? -1 : tok->eod();
    opts.vocab_size = tok->vocab_size();  // every generated id must decode (a model's vocabulary may be larger)
    if ((speculative || !draft_dir.empty()) && opts.temperature != 0.0)
      fail(speculative ? "--speculative" : "--draft-model", " decodes greedily: give --temperature 0");
    if (!draft_dir.empty()) {
      draft_model = load_inference_model(draft_dir, tokenizer, precision, weights_dtype).model;
      set_kv_cache(*draft_model);
    }
    if (json) return print_json(*model, *tok, input, loaded.load_s);
    std::fputs(prompt_ids.empty() ? prompt.c_str() : tok->decode(input).c_str(), stdout);
    infer::TextStream stream(*tok, {});
    const auto show = [](const std::string& text) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    };
    if (opts.logprobs >= 0) fail("--logprobs is printed with --json");
    run(
        *model, input,
        [&](const infer::GeneratedToken& t) {
          show(stream.push(t.id));
          return true;
        },
        nullptr, nullptr);
    show(stream.finish());
    std::fputc('\n', stdout);
  });
}

}  // namespace megaton::app
