// Runs a shell command (the megaton CLI in end-to-end tests) and captures its exit code and output.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace megaton::testing {

struct CommandResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

inline CommandResult run_command(const std::string& cmd) {
  CommandResult r{0, {}};
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace megaton::testing
