// JSON Lines metrics: one object per line, flushed as written so a crash loses nothing logged.
#pragma once
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace megaton::train {

// Wall-clock seconds since the epoch for the "time" of records: comparable with the checkpoint
// writer's timestamps and across restarted processes.
double unix_time();

class MetricsLog {
 public:
  // append: continue an existing file (a resumed or restarted run); otherwise start it afresh so
  // a new run's records never mix with an earlier run's in the same directory. An empty path
  // writes nowhere (the ranks of a distributed run other than rank 0).
  MetricsLog(const std::string& path, bool append);
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace megaton::train
