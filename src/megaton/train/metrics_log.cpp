#include "megaton/train/metrics_log.h"

#include <chrono>

#include "megaton/core/error.h"

namespace megaton::train {

double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

MetricsLog::MetricsLog(const std::string& path, bool append)
    : path_(path) {
  if (path.empty()) return;
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!out_) fail("cannot open metrics file '", path, "' for writing");
}

void MetricsLog::write(const nlohmann::json& record) {
  if (path_.empty()) return;
  out_ << record.dump() << '\n';
  out_.flush();
  if (!out_) fail("failed writing metrics file '", path_, "'");
}

}  // namespace megaton::train
