// Numeric command-line options checked before CLI11 converts them: the whole text must be a number
// of the option's type (a plain decimal integer for integer options, no 8.0 or 1e3; a finite
// number for real ones) within [lo, hi]. The message names the value and gives the range in plain
// numbers ("--top-p: 2 is out of range: must be in [0, 1]"), where CLI11's own checks print the
// largest double in full.
#pragma once
#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>

namespace megaton::app {

template <typename T>
CLI::Validator in_range(T lo, T hi = std::numeric_limits<T>::max()) {
  static_assert(std::is_arithmetic_v<T>);
  auto number = [](T v) {
    std::ostringstream os;
    os << v;
    return os.str();
  };
  const std::string range = hi == std::numeric_limits<T>::max() ? "at least " + number(lo)
                                                                 : "in [" + number(lo) + ", " + number(hi) + "]";
  return CLI::Validator(
      [lo, hi, range, number](std::string& text) -> std::string {
        T v{};
        bool whole = false;
        if constexpr (std::is_integral_v<T>) {
          const char* begin = text.data() + (text.starts_with('+') ? 1 : 0);
          const auto [end, ec] = std::from_chars(begin, text.data() + text.size(), v);
          if (ec == std::errc::result_out_of_range)
            return text + " is out of range: must be in [" + number(lo) + ", " + number(hi) + "]";
          whole = ec == std::errc() && end == text.data() + text.size() && begin != end;
          if (!whole) return "'" + text + "' is not a whole number";
        } else {
          char* end = nullptr;
          v = static_cast<T>(std::strtod(text.c_str(), &end));
          whole = !text.empty() && !std::isspace(static_cast<unsigned char>(text[0])) && end == text.c_str() + text.size();
          if (!whole || !std::isfinite(v)) return "'" + text + "' is not a finite number";
        }
        if (v < lo || v > hi) return text + " is out of range: must be " + range;
        return {};
      },
      range);
}

}  // namespace megaton::app
