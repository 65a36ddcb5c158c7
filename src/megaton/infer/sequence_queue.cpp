#include "megaton/infer/sequence_queue.h"

#include <algorithm>
#include <exception>
#include <list>
#include <span>

#include "megaton/core/threads.h"

namespace megaton::infer {

std::vector<std::string> Sequence::take_pieces() {
  std::unique_lock lock(mutex);
  changed.wait(lock, [&] { return done || !pieces.empty(); });
  std::vector<std::string> out(std::make_move_iterator(pieces.begin()), std::make_move_iterator(pieces.end()));
  pieces.clear();
  return out;
}

std::vector<LoggedToken> Sequence::take_logprobs() {
  std::lock_guard lock(mutex);
  std::vector<LoggedToken> out(logprobs.begin() + static_cast<std::ptrdiff_t>(logprobs_taken), logprobs.end());
  logprobs_taken = logprobs.size();
  return out;
}

void Sequence::finish(const std::string& failure) {
  std::lock_guard lock(mutex);
  error = failure;
  done = true;
  changed.notify_all();
  finished.notify_all();
}

void Sequence::wait_done() {
  std::unique_lock lock(mutex);
  finished.wait(lock, [&] { return done; });
}

SequenceQueue::SequenceQueue(models::TransformerModel& model, const data::Tokenizer& tokenizer, int capacity,
                             int64_t kv_cache_tokens, DType kv_dtype)
    : model_(model),
      tokenizer_(tokenizer),
      capacity_(capacity),
      kv_cache_tokens_(kv_cache_tokens),
      kv_dtype_(kv_dtype) {
  release_idle_threads();  // generation's OpenMP regions run on thread_ from now on (core/threads.h)
  thread_ = std::thread([this] { run(); });
}

SequenceQueue::~SequenceQueue() {
  stopping_ = true;
  {
    std::lock_guard lock(mutex_);
    quit_ = true;
  }
  wake_.notify_all();
  thread_.join();
  for (const auto& seq : waiting_) seq->finish("the server is shutting down");
}

bool SequenceQueue::submit(const std::shared_ptr<Sequence>& seq) {
  {
    std::lock_guard lock(mutex_);
    if (quit_ || static_cast<int>(waiting_.size()) + running_.load() >= capacity_) return false;
    waiting_.push_back(seq);
  }
  wake_.notify_one();
  return true;
}

int SequenceQueue::queued() const {
  std::lock_guard lock(mutex_);
  return static_cast<int>(waiting_.size());
}

std::vector<std::shared_ptr<Sequence>> SequenceQueue::take_waiting(std::unique_lock<std::mutex>&) {
  std::vector<std::shared_ptr<Sequence>> taken(std::make_move_iterator(waiting_.begin()),
                                               std::make_move_iterator(waiting_.end()));
  waiting_.clear();
  running_ += static_cast<int>(taken.size());  // under the lock: submit() never sees them in neither place
  return taken;
}

void SequenceQueue::end(Sequence& seq, const std::string& error) {
  --running_;
  seq.finish(error);
}

void SequenceQueue::publish(Sequence& seq, std::string piece) {
  std::lock_guard lock(seq.mutex);
  if (!seq.first_token_s)
    seq.first_token_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - seq.queued_at).count();
  if (piece.empty()) return;
  seq.text += piece;
  seq.pieces.push_back(std::move(piece));
  seq.changed.notify_all();
}

bool SequenceQueue::on_token(Sequence& seq, Output& out, const GeneratedToken& token) {
  ++generated_tokens_;
  const int32_t id = token.id;
  LoggedToken logged;
  if (seq.sampling.logprobs >= 0) {
    const auto text_of = [&](int32_t t) { return tokenizer_.decode(std::span<const int32_t>(&t, 1)); };
    logged = {text_of(id), token.logprob, {}};
    for (const TokenLogprob& alt : token.top) logged.top.emplace_back(text_of(alt.id), alt.logprob);
  }
  {
    std::lock_guard lock(seq.mutex);
    ++seq.completion_tokens;
    if (seq.sampling.logprobs >= 0) seq.logprobs.push_back(std::move(logged));
  }
  if (id == seq.sampling.stop_token) {  // the end of the document: no text of its own
    out.ended_by_model = true;
    publish(seq, {});
    return false;
  }
  publish(seq, out.stream.push(id));
  return !out.stream.stopped() && !seq.cancelled && !stopping_;
}

void SequenceQueue::finish_text(Sequence& seq, Output& out) {
  publish(seq, out.stream.finish());
  std::lock_guard lock(seq.mutex);
  seq.finish_reason = out.ended_by_model || out.stream.stopped() ? "stop" : "length";
}

void SequenceQueue::run() {
  if (model_.supports_paged_kv()) return run_batched();
  for (;;) {
    std::vector<std::shared_ptr<Sequence>> taken;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return quit_ || !waiting_.empty(); });
      if (quit_) return;
      taken = take_waiting(lock);
    }
    for (const auto& seq : taken) {
      std::string error;
      try {
        if (!seq->cancelled) generate_one(*seq);
      } catch (const std::exception& e) {
        error = e.what();
      }
      end(*seq, error);
    }
  }
}

void SequenceQueue::generate_one(Sequence& seq) {
  Output out(tokenizer_, seq);
  generate(model_, seq.prompt, seq.sampling, [&](const GeneratedToken& t) { return on_token(seq, out, t); });
  finish_text(seq, out);
}

void SequenceQueue::run_batched() {
  // Up to 16 sequences decode together.
  BatchingOptions options{.max_running = std::min(capacity_, 16), .kv_dtype = kv_dtype_};
  if (kv_cache_tokens_ > 0) options.num_pages = (kv_cache_tokens_ + options.page_size - 1) / options.page_size;
  std::optional<ContinuousBatcher> batcher(std::in_place, model_, options);
  kv_pages_ = batcher->num_pages();
  int64_t earlier_preemptions = 0;  // those of batchers replaced after a failed step
  struct Active {
    std::shared_ptr<Sequence> seq;
    Output out;
    int64_t id = -1;
  };
  std::list<Active> active;  // stable addresses: the batcher's callbacks hold them
  const auto fail_all = [&](const std::string& error) {
    for (Active& a : active) end(*a.seq, error);
    active.clear();
  };
  for (;;) {
    std::vector<std::shared_ptr<Sequence>> arrived;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return quit_ || !waiting_.empty() || !active.empty(); });
      if (quit_) return fail_all("the server is shutting down");
      arrived = take_waiting(lock);
    }
    for (const auto& seq : arrived) {
      if (seq->cancelled) {
        end(*seq, "");
        continue;
      }
      Active& a = active.emplace_back(Active{seq, Output(tokenizer_, *seq), -1});
      try {
        a.id = batcher->submit(seq->prompt, seq->sampling,
                               [this, &a](const GeneratedToken& t) { return on_token(*a.seq, a.out, t); });
      } catch (const std::exception& e) {
        end(*seq, e.what());
        active.pop_back();
      }
    }
    try {
      batcher->step();
    } catch (const std::exception& e) {  // the batch's state is unknown: every sequence in it fails
      fail_all(e.what());
      earlier_preemptions += batcher->preemptions();
      batcher.emplace(model_, options);
    }
    kv_pages_used_ = batcher->used_pages();
    preemptions_ = earlier_preemptions + batcher->preemptions();
    for (auto it = active.begin(); it != active.end();) {
      if (!batcher->done(it->id)) {
        ++it;
        continue;
      }
      finish_text(*it->seq, it->out);
      end(*it->seq, "");
      it = active.erase(it);
    }
  }
}

}  // namespace megaton::infer
