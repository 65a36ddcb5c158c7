#include "megaton/data/split.h"

#include <cmath>
#include <cstdlib>
#include <vector>

#include "megaton/core/error.h"

namespace megaton::data {

std::string_view split_name(Split s) {
  static constexpr std::array<std::string_view, 3> kNames{"train", "valid", "test"};
  return kNames[static_cast<size_t>(s)];
}

SplitMatrix parse_split(std::string_view split) {
  std::vector<double> ratios;
  for (size_t i = 0; i < split.size();) {
    auto is_number_char = [&](size_t k) { return k < split.size() && (split[k] == '.' || std::isdigit(split[k])); };
    if (!is_number_char(i)) {
      ++i;
      continue;
    }
    size_t j = i;
    while (is_number_char(j)) ++j;
    const std::string number(split.substr(i, j - i));
    char* end = nullptr;
    const double v = std::strtod(number.c_str(), &end);
    if (end != number.c_str() + number.size())
      fail("split '", split, "': '", number, "' is not a number (expected ratios such as 969,30,1)");
    ratios.push_back(v);
    i = j;
  }
  if (ratios.empty() || ratios.size() > 3)
    fail("split '", split, "': expected one to three train,valid,test ratios such as 969,30,1, got ", ratios.size());
  ratios.resize(3, 0.0);
  // Summed and divided in order, as numpy does for three float64 values, so the book-ends match bit for bit.
  const double sum = ratios[0] + ratios[1] + ratios[2];
  if (sum <= 0) fail("split '", split, "': the ratios sum to zero");

  SplitMatrix m;
  double begin = 0;
  for (size_t i = 0; i < 3; ++i) {
    const double end = begin + ratios[i] / sum;
    if (end > begin) m[i] = std::make_pair(begin, end);
    begin = end;
  }
  return m;
}

std::optional<std::pair<int64_t, int64_t>> split_documents(const SplitMatrix& m, Split s, int64_t num_documents) {
  const auto& bounds = m[static_cast<size_t>(s)];
  if (!bounds) return std::nullopt;
  // std::nearbyint in the default rounding mode rounds halves to even, as Python's round() does.
  const auto cut = [&](double f) {
    return static_cast<int64_t>(std::nearbyint(f * static_cast<double>(num_documents)));
  };
  return std::make_pair(cut(bounds->first), cut(bounds->second));
}

}  // namespace megaton::data
