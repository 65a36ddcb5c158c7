#include "megaton/train/supervisor.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "megaton/core/error.h"

namespace megaton::train {

namespace {

volatile sig_atomic_t g_child = 0;
volatile sig_atomic_t g_stop_signal = 0;

void forward_signal(int sig) {
  g_stop_signal = sig;
  if (g_child > 0) ::kill(static_cast<pid_t>(g_child), sig);
}

std::string describe(int status) {
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

// Starts this executable with `args`; returns its wait status.
int run_child(const std::vector<std::string>& args) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::vector<char*> argv{const_cast<char*>(self.c_str())};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(nullptr);  // or the child would inherit (and repeat) unflushed output
  const pid_t pid = ::fork();
  if (pid < 0) fail("cannot start the training process: fork: ", std::strerror(errno));
  if (pid == 0) {
    ::execv(self.c_str(), argv.data());
    std::fprintf(stderr, "error: cannot run %s: %s\n", self.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  g_child = pid;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) fail("waiting for the training process ", pid, ": ", std::strerror(errno));
  g_child = 0;
  return status;
}

}  // namespace

void supervise(const std::vector<std::string>& args, const std::vector<std::string>& restart_args, int max_restarts,
               const std::string& metrics_path) {
  auto metrics_bytes = [&] {
    std::error_code ec;
    const auto n = std::filesystem::file_size(metrics_path, ec);
    return ec ? uintmax_t{0} : n;
  };
  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  for (int restart = 0;; ++restart) {
    const uintmax_t logged = metrics_bytes();
    const int status = run_child(restart == 0 ? args : restart_args);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
    if (g_stop_signal) fail("training stopped by signal ", static_cast<int>(g_stop_signal), "; the process ", describe(status));
    if (metrics_bytes() == logged)
      fail("the training process ", describe(status), " before it started training (nothing new in ", metrics_path,
           "); not restarting, that would fail the same way");
    if (restart == max_restarts)
      fail("the training process ", describe(status), "; giving up after ", max_restarts, " restarts (--max-restarts)");
    std::fprintf(stderr, "megaton train: the training process %s; restarting from the latest valid checkpoint (restart %d of %d)\n",
                 describe(status).c_str(), restart + 1, max_restarts);
  }
}

}  // namespace megaton::train
