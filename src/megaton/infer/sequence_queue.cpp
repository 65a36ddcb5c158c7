#include "megaton/infer/sequence_queue.h"

#include <exception>

#include "megaton/infer/text_stream.h"

namespace megaton::infer {

std::vector<std::string> Sequence::take_pieces() {
  std::unique_lock lock(mutex);
  changed.wait(lock, [&] { return done || !pieces.empty(); });
  std::vector<std::string> out(std::make_move_iterator(pieces.begin()), std::make_move_iterator(pieces.end()));
  pieces.clear();
  return out;
}

void Sequence::wait_done() {
  std::unique_lock lock(mutex);
  changed.wait(lock, [&] { return done; });
}

SequenceQueue::SequenceQueue(models::TransformerModel& model, const data::Tokenizer& tokenizer, int capacity)
    : model_(model), tokenizer_(tokenizer), capacity_(capacity), thread_([this] { run(); }) {}

SequenceQueue::~SequenceQueue() {
  stopping_ = true;
  {
    std::lock_guard lock(mutex_);
    quit_ = true;
  }
  wake_.notify_all();
  thread_.join();
  for (const auto& seq : waiting_) {
    std::lock_guard lock(seq->mutex);
    seq->error = "the server is shutting down";
    seq->done = true;
    seq->changed.notify_all();
  }
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

void SequenceQueue::run() {
  for (;;) {
    std::shared_ptr<Sequence> seq;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return quit_ || !waiting_.empty(); });
      if (quit_) return;
      seq = std::move(waiting_.front());
      waiting_.pop_front();
      ++running_;  // under the lock: submit() never sees the sequence in neither place
    }
    std::string error;
    try {
      if (!seq->cancelled) generate_one(*seq);
    } catch (const std::exception& e) {
      error = e.what();
    }
    --running_;
    std::lock_guard lock(seq->mutex);
    seq->error = error;
    seq->done = true;
    seq->changed.notify_all();
  }
}

void SequenceQueue::generate_one(Sequence& seq) {
  TextStream stream(tokenizer_, seq.stop);
  const auto publish = [&](std::string piece) {
    std::lock_guard lock(seq.mutex);
    if (!seq.first_token_s)
      seq.first_token_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - seq.queued_at).count();
    if (piece.empty()) return;
    seq.text += piece;
    seq.pieces.push_back(std::move(piece));
    seq.changed.notify_all();
  };
  bool ended_by_model = false;
  generate(model_, seq.prompt, seq.sampling, [&](int32_t id) {
    ++generated_tokens_;
    {
      std::lock_guard lock(seq.mutex);
      ++seq.completion_tokens;
    }
    if (id == seq.sampling.stop_token) {  // the end of the document: no text of its own
      ended_by_model = true;
      publish({});
      return false;
    }
    publish(stream.push(id));
    return !stream.stopped() && !seq.cancelled && !stopping_;
  });
  publish(stream.finish());
  std::lock_guard lock(seq.mutex);
  seq.finish_reason = ended_by_model || stream.stopped() ? "stop" : "length";
}

}  // namespace megaton::infer
