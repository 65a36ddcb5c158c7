// JSON Lines metrics: one object per line, flushed as written so a crash loses nothing logged.
#pragma once
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace megaton::train {

class MetricsLog {
 public:
  explicit MetricsLog(const std::string& path);
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace megaton::train
