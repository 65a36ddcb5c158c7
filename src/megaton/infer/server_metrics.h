// What `megaton serve` reports at /metrics, in Prometheus' text format (version 0.0.4).
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace megaton::infer {

class ServerMetrics {
 public:
  // endpoint: a known path, anything else counted as "other" (bounded label values).
  void count_request(const std::string& path, int status);
  void observe_sequence(int64_t prompt_tokens, int64_t completion_tokens, double seconds,
                        std::optional<double> first_token_s);
  // kv_pages_used / kv_pages: the paged KV cache's pages (0 / 0 when sequences run one at a time).
  std::string prometheus(int queued, int running, int capacity, int64_t kv_pages_used, int64_t kv_pages) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0, sequences_ = 0, first_tokens_ = 0;
  double seconds_ = 0, first_token_seconds_ = 0;
};

}  // namespace megaton::infer
