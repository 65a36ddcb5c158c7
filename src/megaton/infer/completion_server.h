// `megaton serve`: an OpenAI-compatible HTTP server over one loaded model (cpp-httplib).
// Endpoints: POST /v1/completions and /v1/chat/completions (streaming as server-sent events),
// GET /v1/models, /health and /metrics (Prometheus text). Sequences run on a single generation
// thread (sequence_queue.h: continuous batching; the model and its KV cache are not shared between threads);
// up to `max_sequences` wait or run at once and more are refused with 429, so memory stays bounded.
// A client that disconnects mid-stream cancels its sequence. Every error is a JSON body
// {"error": {"message", "type", "param", "code"}} with a 4xx/5xx status; no request input can stop
// the server.
#pragma once
#include <memory>
#include <string>

#include "megaton/data/tokenizer.h"
#include "megaton/infer/completion_request.h"
#include "megaton/models/transformer_model.h"

namespace megaton::infer {

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless the user opens it up
  int port = 8000;                 // 0: any free port (bind() says which)
  std::string api_key;             // when set, /v1/* needs "Authorization: Bearer <key>"
  std::string model_name;          // the id /v1/models lists and responses carry
  RequestLimits limits;
  int64_t max_request_bytes = int64_t{1} << 20;
  int64_t max_prompt_tokens = 0;   // 0: the model's context less one position
  int max_sequences = 16;          // queued + running; more get 429
  // Tokens the paged KV cache holds for all running sequences together (continuous batching; a
  // request is admitted when its whole length fits beside the others; a longer one is refused).
  // 0: 16 sequences of up to 2048 tokens.
  int64_t kv_cache_tokens = 0;
  DType kv_cache_dtype = DType::F32;  // the pages' dtype: f32, bf16 or f8e4m3
};

class CompletionServer {
 public:
  CompletionServer(models::TransformerModel& model, const data::Tokenizer& tokenizer, ServerOptions options);
  ~CompletionServer();
  CompletionServer(const CompletionServer&) = delete;
  CompletionServer& operator=(const CompletionServer&) = delete;

  int bind();    // binds host:port; returns the port; fails naming the address
  void serve();  // answers requests until stop()
  void stop();   // from any thread; queued sequences end with an error

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace megaton::infer
