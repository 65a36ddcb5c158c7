#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "commands.h"
#include "inference_model.h"
#include "option_range.h"
#include "megaton/core/threads.h"
#include "megaton/infer/completion_server.h"

namespace megaton::app {

void add_serve_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "Serve an HF-format model over an OpenAI-compatible HTTP API "
                                          "(/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics)");
  static std::string model_dir, tokenizer = "byte", precision = "fp32", weights_dtype = "auto", kv_dtype = "auto";
  static int threads = 0;
  static infer::ServerOptions o;
  cmd->add_option("--model", model_dir, "HF model folder (config.json + model.safetensors)")->required();
  cmd->add_option("--tokenizer", tokenizer, "Tokenizer spec")->capture_default_str();
  cmd->add_option("--host", o.host, "Address to listen on (loopback by default; 0.0.0.0 opens it to the network)")
      ->capture_default_str();
  cmd->add_option("--port", o.port, "Port (0: any free one, printed at start)")->capture_default_str()
      ->check(in_range(0, 65535));
  cmd->add_option("--api-key", o.api_key,
                  "Require 'Authorization: Bearer KEY' on /v1/* (default: the MEGATON_API_KEY environment variable, "
                  "else none)");
  cmd->add_option("--model-name", o.model_name, "The model id responses carry (default: the folder's name)");
  cmd->add_option("--max-sequences", o.max_sequences, "Sequences that may wait or run at once; more get HTTP 429")
      ->capture_default_str()->check(in_range(1, 4096));
  cmd->add_option("--kv-cache-tokens", o.kv_cache_tokens,
                  "Tokens the paged KV cache holds for all running sequences; a request longer than it is refused "
                  "(0: 16 x min(context, 2048))")
      ->capture_default_str()->check(in_range<int64_t>(0, int64_t{1} << 30));
  cmd->add_option("--kv-cache-dtype", kv_dtype,
                  "The KV pages' dtype: f32; bf16 (half the bytes per cached token); or fp8 (E4M3 with a scale per "
                  "token and head, or per 64-column run of an MLA latent: about a quarter). The attention's math "
                  "stays f32. auto: bf16 under --precision bf16, else f32")
      ->capture_default_str()->check(CLI::IsMember({"auto", "f32", "bf16", "fp8"}));
  cmd->add_option("--max-tokens", o.limits.max_completion_tokens,
                  "The most tokens one request may generate (and a chat request's default)")
      ->capture_default_str()->check(in_range<int64_t>(1, int64_t{1} << 24));
  cmd->add_option("--max-prompt-tokens", o.max_prompt_tokens, "The longest prompt accepted (0: the model's context - 1)")
      ->capture_default_str()->check(in_range<int64_t>(0, int64_t{1} << 24));
  cmd->add_option("--max-request-bytes", o.max_request_bytes, "The largest request body accepted (HTTP 413 above)")
      ->capture_default_str()->check(in_range<int64_t>(1024, int64_t{1} << 30));
  add_inference_dtype_options(cmd, precision, weights_dtype);
  cmd->add_option("--threads", threads, "CPU threads")->check(in_range(0, 4096));
  cmd->callback([] {
    // SIGINT / SIGTERM stop the server cleanly: blocked in every thread (the OpenMP and HTTP threads
    // inherit the mask) and taken by one thread that asks the server to stop.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    set_num_threads(threads);
    if (o.api_key.empty())
      if (const char* key = std::getenv("MEGATON_API_KEY")) o.api_key = key;
    if (o.model_name.empty()) o.model_name = std::filesystem::path(model_dir).lexically_normal().filename().string();
    if (o.model_name.empty()) o.model_name = std::filesystem::absolute(model_dir).parent_path().filename().string();
    o.kv_cache_dtype = kv_dtype == "fp8"                                                 ? DType::F8E4M3
                       : kv_dtype == "bf16" || (kv_dtype == "auto" && precision == "bf16") ? DType::BF16
                                                                                          : DType::F32;
    InferenceModel m = load_inference_model(model_dir, tokenizer, precision, weights_dtype);
    infer::CompletionServer server(*m.model, *m.tokenizer, o);
    const int port = server.bind();
    std::thread([&server, stop_signals] {
      int sig = 0;
      sigwait(&stop_signals, &sig);
      server.stop();
    }).detach();
    std::printf("megaton serve: %s on http://%s:%d (loaded in %.2f s)\n", o.model_name.c_str(), o.host.c_str(), port,
                m.load_s);
    std::fflush(stdout);
    server.serve();
    std::printf("megaton serve: stopped\n");
  });
}

}  // namespace megaton::app
