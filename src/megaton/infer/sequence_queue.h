// The generation thread of the server: sequences are queued by the HTTP threads and generated one
// at a time, in arrival order, by one thread that owns the model (its KV caches and compute copies
// are not thread-safe). Each sequence hands its text to its HTTP thread piece by piece (streaming),
// and can be cancelled from there (a client that went away) between two tokens.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "megaton/data/tokenizer.h"
#include "megaton/infer/generate.h"
#include "megaton/models/transformer_model.h"

namespace megaton::infer {

struct Sequence {
  std::vector<int32_t> prompt;
  SamplingOptions sampling;
  std::vector<std::string> stop;
  std::chrono::steady_clock::time_point queued_at = std::chrono::steady_clock::now();

  std::atomic<bool> cancelled{false};

  // Filled by the generation thread under `mutex`; `changed` wakes the waiting HTTP thread.
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::string> pieces;  // released text not yet taken
  std::string text;                // all released text
  int64_t completion_tokens = 0;
  std::optional<double> first_token_s;  // from queued_at
  bool done = false;
  std::string finish_reason;       // "stop" (end of document or a stop string) or "length"
  std::string error;               // set when generation failed; done is set too

  // Blocks until there is a piece or the sequence is done; returns the pieces taken (may be empty
  // when done).
  std::vector<std::string> take_pieces();
  void wait_done();
};

class SequenceQueue {
 public:
  SequenceQueue(models::TransformerModel& model, const data::Tokenizer& tokenizer, int capacity);
  ~SequenceQueue();  // ends the thread; sequences still queued end with an error

  // False when `capacity` sequences already wait or run (the caller answers 429).
  bool submit(const std::shared_ptr<Sequence>& seq);
  int queued() const;
  int running() const { return running_.load(); }
  int64_t generated_tokens() const { return generated_tokens_.load(); }

 private:
  void run();
  void generate_one(Sequence& seq);

  models::TransformerModel& model_;
  const data::Tokenizer& tokenizer_;
  const int capacity_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Sequence>> waiting_;
  bool quit_ = false;
  std::atomic<bool> stopping_{false};  // ends the running sequence at its next token
  std::atomic<int> running_{0};
  std::atomic<int64_t> generated_tokens_{0};
  std::thread thread_;
};

}  // namespace megaton::infer
