#include "megaton/train/stop_signal.h"

#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>

namespace megaton::train {

namespace {

volatile sig_atomic_t g_received = 0;
struct sigaction g_previous_int, g_previous_term;

void on_stop_signal(int sig) {
  g_received = sig;
  // write(2) is async-signal-safe; printf is not.
  constexpr char kMessage[] =
      "\nmegaton: stop requested: finishing this step and writing a checkpoint (a second signal stops at once)\n";
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
}

}  // namespace

StopSignals::StopSignals() {
  if (const char* file = std::getenv(kStopFileVariable)) stop_file_ = file;
  g_received = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // SA_RESETHAND: the handler runs once; the next signal takes the default action (ends the process).
  sa.sa_flags = SA_RESETHAND;
  ::sigaction(SIGINT, &sa, &g_previous_int);
  ::sigaction(SIGTERM, &sa, &g_previous_term);
}

StopSignals::~StopSignals() {
  ::sigaction(SIGINT, &g_previous_int, nullptr);
  ::sigaction(SIGTERM, &g_previous_term, nullptr);
}

std::string StopSignals::requested() const {
  if (g_received != 0) return g_received == SIGINT ? "SIGINT" : "SIGTERM";
  if (stop_file_.empty() || ::access(stop_file_.c_str(), F_OK) != 0) return {};
  std::string name;
  std::getline(std::ifstream(stop_file_), name);
  return name == "SIGINT" ? name : "SIGTERM";
}

}  // namespace megaton::train
