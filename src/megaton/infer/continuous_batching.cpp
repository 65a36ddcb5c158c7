#include "megaton/infer/continuous_batching.h"

#include <algorithm>

namespace megaton::infer {

struct ContinuousBatcher::Request {
  std::vector<int32_t> prompt;
  SamplingOptions sampling;
  TokenCallback on_token;
  TokenHistory history;
  int64_t total;  // prompt + new tokens, capped by the model's positions
  nn::PagedSequence seq;
  int64_t prefilled = 0;  // context tokens in the cache
  std::vector<int32_t> out;
  bool finished = false;
  // Generated tokens a preemption dropped from the cache, fed again through prefill (all but the
  // newest, which the next decode step feeds as it would have).
  int64_t refed = 0;

  // What prefill reads: the prompt, then the refed tokens.
  int64_t context() const { return static_cast<int64_t>(prompt.size()) + refed; }
  int32_t context_token(int64_t i) const {
    const auto n = static_cast<int64_t>(prompt.size());
    return i < n ? prompt[static_cast<size_t>(i)] : out[static_cast<size_t>(i - n)];
  }
};

namespace {
int64_t checked_option(const char* what, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) fail("continuous batching: ", what, " ", v, " outside ", lo, " .. ", hi);
  return v;
}
}  // namespace

namespace {
// BatchingOptions::num_pages when it is 0: 16 sequences of up to 2048 tokens (a model of a 128k
// context would otherwise take gigabytes per sequence; a longer request is refused by name).
int64_t pool_pages(const BatchingOptions& o, int64_t context) {
  checked_option("page_size", o.page_size, 1, 1 << 20);
  if (o.num_pages > 0) return o.num_pages;
  return 16 * ((std::min<int64_t>(context, 2048) + o.page_size - 1) / o.page_size);
}
}  // namespace

ContinuousBatcher::ContinuousBatcher(models::TransformerModel& model, const BatchingOptions& o)
    : model_(model),
      options_(o),
      cache_(model.new_paged_kv_cache(pool_pages(o, model.config().max_position_embeddings), o.page_size,
                                      o.kv_dtype)),
      vocab_(model.config().vocab_size) {
  checked_option("max_running", o.max_running, 1, 1 << 16);
  checked_option("prefill_chunk", o.prefill_chunk, 1, 1 << 24);
  model_.refresh_compute_weights();
}

ContinuousBatcher::~ContinuousBatcher() = default;

int64_t ContinuousBatcher::submit(std::vector<int32_t> prompt, const SamplingOptions& sampling,
                                  TokenCallback on_token) {
  if (prompt.empty()) fail("continuous batching: a prompt of no tokens");
  const int64_t max_len = model_.config().max_position_embeddings;
  if (static_cast<int64_t>(prompt.size()) >= max_len)
    fail("continuous batching: prompt of ", prompt.size(), " tokens leaves no room in the model's ", max_len, " positions");
  check_sampling(sampling, "continuous batching");
  for (const int32_t id : prompt)
    if (id < 0 || id >= vocab_) fail("continuous batching: prompt id ", id, " outside the vocabulary of ", vocab_);
  const int64_t total = std::min<int64_t>(static_cast<int64_t>(prompt.size()) + sampling.max_new_tokens, max_len);
  if (cache_.pages_for(total) > cache_.num_pages())
    fail("continuous batching: a sequence of ", total, " tokens needs ", cache_.pages_for(total), " KV pages, the pool has ",
         cache_.num_pages(), " (megaton serve --kv-cache-tokens sizes it)");
  TokenHistory history(sampling, vocab_, prompt);
  // No new tokens asked for: done at once, as generate() returns nothing.
  const bool nothing = total <= static_cast<int64_t>(prompt.size());
  auto r = std::make_unique<Request>(
      Request{std::move(prompt), sampling, std::move(on_token), std::move(history), total, {}, 0, {}, nothing, 0});
  if (!nothing) waiting_.push_back(r.get());
  requests_.push_back(std::move(r));
  return static_cast<int64_t>(requests_.size()) - 1;
}

void ContinuousBatcher::admit() {
  // Pages for its context and first decoded token; decoding takes more as it goes (make_room).
  while (!waiting_.empty() && running() < options_.max_running &&
         cache_.reserve(waiting_.front()->seq, std::min(waiting_.front()->context() + 1, waiting_.front()->total))) {
    running_.push_back(waiting_.front());
    waiting_.pop_front();
  }
}

bool ContinuousBatcher::make_room(Request& r) {
  while (!cache_.reserve(r.seq, r.seq.len + 1)) {
    // The newest admitted still running gives its pages back, as vLLM preempts: r itself when it is
    // the newest (finished ones hold none).
    Request& victim = **std::find_if(running_.rbegin(), running_.rend(), [](const Request* q) { return !q->finished; });
    preempt(victim);
    if (&victim == &r) return false;
  }
  return true;
}

void ContinuousBatcher::preempt(Request& r) {
  cache_.release(r.seq);
  r.prefilled = 0;
  r.refed = r.out.empty() ? 0 : static_cast<int64_t>(r.out.size()) - 1;
  std::erase(running_, &r);
  waiting_.push_front(&r);  // first to come back
  ++preemptions_;
}

void ContinuousBatcher::emit(Request& r, float* logits) {
  const int64_t V = r.sampling.vocab_size > 0 ? std::min(r.sampling.vocab_size, vocab_) : vocab_;
  r.history.penalize(logits);
  // The draw is indexed by the position, as generate() indexes it.
  const int32_t next = sample_token(logits, V, r.sampling, static_cast<uint64_t>(r.seq.len));
  r.history.add_generated(next);
  r.out.push_back(next);
  const bool more = !r.on_token || r.on_token(score_token(logits, V, next, r.sampling.logprobs));
  if (!more || next == r.sampling.stop_token || r.seq.len + 1 >= r.total) finish(r);
}

void ContinuousBatcher::finish(Request& r) {
  r.finished = true;
  cache_.release(r.seq);
}

bool ContinuousBatcher::step() {
  admit();
  if (running_.empty()) return false;
  // One prefill chunk: the first admitted sequence still reading its context (its pages reserved
  // on admission).
  const auto reading =
      std::find_if(running_.begin(), running_.end(), [](const Request* r) { return r->prefilled < r->context(); });
  if (reading != running_.end()) {
    Request& r = **reading;
    const int64_t n = std::min(options_.prefill_chunk, r.context() - r.prefilled);
    Tensor ids = Tensor::empty({1, n}, DType::I32, MemCategory::Activations, "prefill_chunk");
    for (int64_t i = 0; i < n; ++i) ids.data<int32_t>()[i] = r.context_token(r.prefilled + i);
    Tensor logits = model_.forward_paged(cache_, {&r.seq}, ids);
    r.prefilled += n;
    // A preempted sequence has sampled this token already: its next decode step feeds it.
    if (r.prefilled == r.context() && r.out.empty()) emit(r, logits.data<float>());
  }
  // One decode step of every sequence past its context (one that read its last chunk just now
  // included): each feeds its newest token, the oldest admitted taking pages first. Over a copy of
  // running_, which make_room may preempt from; a preempted sequence has its context to read again.
  std::vector<Request*> decoding;
  for (Request* r : std::vector<Request*>(running_))
    if (!r->finished && !r->out.empty() && r->prefilled == r->context() && make_room(*r)) decoding.push_back(r);
  if (!decoding.empty()) {
    const auto S = static_cast<int64_t>(decoding.size());
    Tensor ids = Tensor::empty({S, 1}, DType::I32, MemCategory::Activations, "decode_tokens");
    std::vector<nn::PagedSequence*> seqs;
    for (int64_t s = 0; s < S; ++s) {
      ids.data<int32_t>()[s] = decoding[static_cast<size_t>(s)]->out.back();
      seqs.push_back(&decoding[static_cast<size_t>(s)]->seq);
    }
    Tensor logits = model_.forward_paged(cache_, seqs, ids);
    ++decode_steps_;
    for (int64_t s = 0; s < S; ++s) emit(*decoding[static_cast<size_t>(s)], logits.data<float>() + s * vocab_);
  }
  std::erase_if(running_, [](const Request* r) { return r->finished; });
  return true;
}

bool ContinuousBatcher::done(int64_t id) const { return requests_.at(static_cast<size_t>(id))->finished; }

const std::vector<int32_t>& ContinuousBatcher::output(int64_t id) const {
  return requests_.at(static_cast<size_t>(id))->out;
}

std::vector<std::vector<int32_t>> generate_batched(models::TransformerModel& model,
                                                   const std::vector<std::vector<int32_t>>& prompts,
                                                   const std::vector<SamplingOptions>& sampling,
                                                   const BatchingOptions& options) {
  if (sampling.size() != prompts.size())
    fail("generate_batched: ", prompts.size(), " prompts and ", sampling.size(), " sampling options");
  ContinuousBatcher batcher(model, options);
  std::vector<int64_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i) ids.push_back(batcher.submit(prompts[i], sampling[i]));
  batcher.run_until_idle();
  std::vector<std::vector<int32_t>> out;
  for (const int64_t id : ids) out.push_back(batcher.output(id));
  return out;
}

}  // namespace megaton::infer
