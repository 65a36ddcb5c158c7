// Errors that say what and where: every message names the tensor, key or file at fault.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace megaton {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// Throw megaton::Error with the streamed arguments as the message.
template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(detail::concat(std::forward<Args>(args)...));
}

}  // namespace megaton

// Check a condition; on failure throw megaton::Error naming the condition and the context.
#define MEGATON_CHECK(cond, ...)                                     \
  do {                                                               \
    if (!(cond)) ::megaton::fail(__VA_ARGS__, " [check: " #cond "]"); \
  } while (0)
