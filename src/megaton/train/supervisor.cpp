#include "megaton/train/supervisor.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "megaton/core/error.h"
#include "megaton/train/stop_signal.h"

namespace megaton::train {

namespace {

volatile sig_atomic_t g_child = 0;
volatile sig_atomic_t g_child_is_launcher = 0;
volatile sig_atomic_t g_stop_signal = 0;
char g_stop_file[4096];  // MEGATON_STOP_FILE of the children (a handler may not build strings)

// The first signal asks the child to stop through the stop file (stop_signal.h); a second ends it at
// once: a launcher gets the signal (mpirun then kills its ranks), this executable SIGKILL (a signal
// it can catch would only ask it again to stop cleanly).
void on_signal(int sig) {
  if (g_stop_signal == 0) {
    g_stop_signal = sig;
    if (const int fd = ::open(g_stop_file, O_WRONLY | O_CREAT | O_TRUNC, 0644); fd >= 0) {
      const char* name = sig == SIGINT ? "SIGINT\n" : "SIGTERM\n";
      [[maybe_unused]] const ssize_t n = ::write(fd, name, sig == SIGINT ? 7 : 8);
      ::close(fd);
    }
    constexpr char kMessage[] =
        "\nmegaton train: stop requested: the run finishes its step and writes a checkpoint (a second signal stops "
        "it at once)\n";
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
    return;
  }
  if (g_child > 0) ::kill(static_cast<pid_t>(g_child), g_child_is_launcher ? sig : SIGKILL);
}

std::string describe(int status) {
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

// Starts `command` (its program looked up in PATH); returns its wait status.
int run_child(const std::vector<std::string>& command) {
  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(nullptr);  // or the child would inherit (and repeat) unflushed output
  const pid_t pid = ::fork();
  if (pid < 0) fail("cannot start the training process: fork: ", std::strerror(errno));
  if (pid == 0) {
    // Its own process group: a terminal's Ctrl-C (sent to the foreground group) reaches the child
    // once, forwarded by the supervisor, not twice (twice would stop it at once). Off the
    // foreground group it must not read the terminal (mpirun forwards stdin), so stdin is /dev/null.
    ::setpgid(0, 0);
    if (const int null = ::open("/dev/null", O_RDONLY); null >= 0) ::dup2(null, STDIN_FILENO);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "error: cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  g_child = pid;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) fail("waiting for the training process ", pid, ": ", std::strerror(errno));
  g_child = 0;
  return status;
}

// `name` itself when it holds a '/', else the first executable of that name in PATH; "" if none.
std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

}  // namespace

std::string self_executable() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

std::vector<std::string> launch_command(const std::string& launcher, int nproc) {
  if (nproc < 1) fail("--nproc ", nproc, ": a job needs at least one process");
  std::vector<std::string> words;
  if (launcher.empty()) {
    // -x: Open MPI passes an environment variable to ranks on other hosts only when named; the
    // supervisor asks the ranks to stop through the file this one names.
    words = {"mpirun", "-np", std::to_string(nproc), "-x", kStopFileVariable};
    if (::geteuid() == 0) words.insert(words.end(), {"--allow-run-as-root", "--oversubscribe"});
  } else {
    std::istringstream in(launcher);
    for (std::string w; in >> w;) {
      for (size_t p; (p = w.find("{nproc}")) != std::string::npos;) w.replace(p, 7, std::to_string(nproc));
      words.push_back(w);
    }
    if (words.empty()) fail("launcher '", launcher, "' is empty (--launcher or MEGATON_LAUNCHER)");
  }
  if (find_program(words[0]).empty())
    fail("cannot start ", nproc, " training processes: launcher program '", words[0], "' not found",
         words[0].find('/') == std::string::npos ? " in PATH" : "",
         launcher.empty() ? " (install Open MPI, or name another launcher with --launcher or MEGATON_LAUNCHER)"
                          : " (from the launcher '" + launcher + "')");
  return words;
}

bool supervise(const std::vector<std::string>& command, const std::vector<std::string>& restart_command,
               int max_restarts, const std::string& metrics_path) {
  if (command.empty() || restart_command.empty()) fail("supervise: no command to run");
  // This executable re-run is "the training process"; a launcher's job is named by its launcher.
  const std::string what =
      command[0] == self_executable() ? "the training process" : "the training job (" + command[0] + ")";
  auto metrics_bytes = [&] {
    std::error_code ec;
    const auto n = std::filesystem::file_size(metrics_path, ec);
    return ec ? uintmax_t{0} : n;
  };
  // The stop file lives in the run directory, named for this process, and goes with it.
  const std::string stop_file =
      (std::filesystem::path(metrics_path).parent_path() / ("stop_requested." + std::to_string(::getpid()))).string();
  if (stop_file.size() >= sizeof g_stop_file) fail("run directory path too long: ", stop_file);
  std::snprintf(g_stop_file, sizeof g_stop_file, "%s", stop_file.c_str());
  ::setenv(kStopFileVariable, stop_file.c_str(), 1);
  struct RemoveStopFile {
    std::string path;
    ~RemoveStopFile() {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
  } remove_stop_file{stop_file};
  g_child_is_launcher = command[0] != self_executable();
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  for (int restart = 0;; ++restart) {
    const uintmax_t logged = metrics_bytes();
    const int status = run_child(restart == 0 ? command : restart_command);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
    // Stopped by the user: through this process, or by a signal sent to the child itself.
    const bool signalled = g_stop_signal || (WIFSIGNALED(status) && (WTERMSIG(status) == SIGINT || WTERMSIG(status) == SIGTERM));
    if (WIFEXITED(status) && WEXITSTATUS(status) == kStoppedExitStatus) {
      std::fprintf(stderr, "megaton train: %s stopped after writing a checkpoint; not restarting\n", what.c_str());
      return false;
    }
    if (signalled)
      fail("training stopped by ", g_stop_signal ? "signal " + std::to_string(g_stop_signal) : "a signal to it", "; ",
           what, " ", describe(status), "; not restarting");
    if (metrics_bytes() == logged)
      fail(what, " ", describe(status), " before it started training (nothing new in ", metrics_path,
           "); not restarting, that would fail the same way");
    if (restart == max_restarts)
      fail(what, " ", describe(status), "; giving up after ", max_restarts, " restarts (--max-restarts)");
    std::fprintf(stderr, "megaton train: %s %s; restarting from the latest valid checkpoint (restart %d of %d)\n",
                 what.c_str(), describe(status).c_str(), restart + 1, max_restarts);
  }
}

}  // namespace megaton::train
