// Line iteration over text held in memory, for the line-oriented vocabulary files.
#pragma once
#include <cstddef>
#include <string_view>

namespace megaton::data {

// Calls f(line_number, line) for each line of `text`: numbered from 1, without its "\n" or "\r\n"; a last
// line without a line break counts, an empty text has no lines.
template <typename F>
void for_each_line(std::string_view text, F&& f) {
  for (size_t number = 1, pos = 0; pos < text.size(); ++number) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.ends_with('\r')) line.remove_suffix(1);
    f(number, line);
  }
}

}  // namespace megaton::data
