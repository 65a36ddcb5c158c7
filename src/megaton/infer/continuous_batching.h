// Continuous batching over a paged KV cache (nn/paged_kv_cache.h), as vLLM and SGLang serve:
// sequences join and leave between steps; each step runs one prefill chunk of the oldest sequence
// still reading its prompt (chunked, so a long prompt does not stall the others), then one decode
// step of every sequence already generating, all of them in one batch (one GEMM per weight for
// the whole batch instead of one GEMV per sequence). Each sequence samples exactly as generate()
// does (its own seed, penalties and stop token), so its tokens are generate()'s up to the rounding
// of batched GEMMs (and, after a preemption, of its tokens' keys and values recomputed by prefill).
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "megaton/infer/generate.h"
#include "megaton/nn/paged_kv_cache.h"

namespace megaton::infer {

struct BatchingOptions {
  int64_t page_size = 64;      // tokens per KV page (a multiple of 64 keeps decode sums unbatched-exact)
  // 0: 16 sequences of min(context, 2048) tokens.
  int64_t num_pages = 0;
  int64_t max_running = 16;    // sequences admitted at once
  int64_t prefill_chunk = 256; // prompt tokens per step
  DType kv_dtype = DType::F32;  // the pages' dtype: f32, bf16 or f8e4m3 (nn/paged_kv_cache.h)
};

class ContinuousBatcher {
 public:
  ContinuousBatcher(models::TransformerModel& model, const BatchingOptions& options);
  ~ContinuousBatcher();

  // Queues a request; it is admitted when a slot and pages for its prompt and first token are free,
  // and takes a page more whenever its tokens fill the last. When a decoding sequence finds the pool
  // empty, the newest admitted sequence is preempted, as vLLM does: its pages go back, and it waits
  // at the front of the queue to recompute its prompt and tokens so far through prefill (its output
  // and sampling state kept). on_token sees each new token (with its log-probabilities when
  // sampling.logprobs >= 0) and returns whether to go on. Returns the request's id.
  int64_t submit(std::vector<int32_t> prompt, const SamplingOptions& sampling, TokenCallback on_token = {});
  // One step (a prefill chunk and a batched decode step); false when nothing is queued or running.
  bool step();
  void run_until_idle() { while (step()) {} }

  bool done(int64_t id) const;
  const std::vector<int32_t>& output(int64_t id) const;
  int64_t running() const { return static_cast<int64_t>(running_.size()); }
  int64_t waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t used_pages() const { return cache_.used_pages(); }
  int64_t num_pages() const { return cache_.num_pages(); }
  int64_t decode_steps() const { return decode_steps_; }  // batched decode steps run so far
  int64_t preemptions() const { return preemptions_; }    // sequences preempted so far

 private:
  struct Request;
  void admit();
  // Pages for r's next token, preempting the newest sequences until they free one; false when r was
  // the one preempted.
  bool make_room(Request& r);
  void preempt(Request& r);
  // Samples the request's next token from one row of logits; ends it when it is done.
  void emit(Request& r, float* logits);
  void finish(Request& r);

  models::TransformerModel& model_;
  BatchingOptions options_;
  nn::PagedKVCache cache_;
  int64_t vocab_;
  std::vector<std::unique_ptr<Request>> requests_;  // by id
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;  // in admission order
  int64_t decode_steps_ = 0;
  int64_t preemptions_ = 0;
};

// Every request to its end through one batcher; the outputs in request order.
std::vector<std::vector<int32_t>> generate_batched(models::TransformerModel& model,
                                                   const std::vector<std::vector<int32_t>>& prompts,
                                                   const std::vector<SamplingOptions>& sampling,
                                                   const BatchingOptions& options = {});

}  // namespace megaton::infer
