#include "megaton/core/cpu_info.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

namespace megaton {

namespace {

// True, with the text after "key<spaces>:" in value, when this /proc/cpuinfo line is the key's.
bool field(const std::string& line, const std::string& key, std::string& value) {
  if (line.compare(0, key.size(), key) != 0) return false;
  const size_t colon = line.find(':', key.size());
  if (colon == std::string::npos || line.find_first_not_of(" \t", key.size()) != colon) return false;
  const size_t start = line.find_first_not_of(' ', colon + 1);
  value = start == std::string::npos ? "" : line.substr(start);
  return true;
}

}  // namespace

CpuInfo cpu_info() {
  CpuInfo info{"unknown", {}};
  std::ifstream in("/proc/cpuinfo");
  std::string line, value;
  std::set<std::string> flags;
  bool have_model = false, have_flags = false;
  while (std::getline(in, line) && !(have_model && have_flags)) {  // the first processor describes them all
    if (!have_model && field(line, "model name", value)) {
      info.model = value;
      have_model = true;
    } else if (!have_flags && field(line, "flags", value)) {
      std::istringstream words(value);
      for (std::string w; words >> w;) flags.insert(w);
      have_flags = true;
    }
  }
  for (const char* f : kCpuFeaturesOfInterest)
    if (flags.count(f)) info.features.emplace_back(f);
  return info;
}

std::string describe(const CpuInfo& cpu) {
  std::string s = cpu.model + " (";
  for (size_t i = 0; i < cpu.features.size(); ++i) s += (i ? " " : "") + cpu.features[i];
  return s + (cpu.features.empty() ? "no AVX2/AVX-512/AMX)" : ")");
}

}  // namespace megaton
