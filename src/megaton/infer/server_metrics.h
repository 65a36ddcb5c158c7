// What `megaton serve` reports at /metrics, in Prometheus' text format (version 0.0.4).
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace megaton::infer {

// The generation thread's state at the time of a scrape (infer/sequence_queue.h).
struct GenerationState {
  int queued = 0, running = 0, capacity = 0;
  int64_t kv_pages_used = 0, kv_pages = 0;  // the paged KV cache's pages (0 / 0: one sequence at a time)
  int64_t preemptions = 0;                  // sequences that gave their pages back and recomputed later
};

class ServerMetrics {
 public:
  // endpoint: a known path, anything else counted as "other" (bounded label values).
  void count_request(const std::string& path, int status);
  void observe_sequence(int64_t prompt_tokens, int64_t completion_tokens, double seconds,
                        std::optional<double> first_token_s);
  std::string prometheus(const GenerationState& g) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0, sequences_ = 0, first_tokens_ = 0;
  double seconds_ = 0, first_token_seconds_ = 0;
};

}  // namespace megaton::infer
