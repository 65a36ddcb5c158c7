// Graceful stop on SIGINT / SIGTERM, Megatron's --exit-signal-handler: the first signal asks the
// trainer to finish the step it is in, write a checkpoint and exit with kStoppedExitStatus; the
// handler then gives the signal back its default action, so a second one ends the process at once
// (files are written to temporaries and renamed, so that leaves no torn file under a real name).
//
// A supervisor (supervisor.h) asks the same without a signal, by creating the file named by the
// environment variable MEGATON_STOP_FILE, holding the name of the signal it received: a signal to
// a launcher such as mpirun reaches the ranks late, and mpirun kills them a second after passing it
// on, too soon to write a checkpoint.
#pragma once
#include <string>

namespace megaton::train {

// The exit status of a run stopped by SIGINT / SIGTERM after writing its checkpoint (README); a
// supervisor does not restart a child that exits with it.
inline constexpr int kStoppedExitStatus = 3;
inline constexpr const char* kStopFileVariable = "MEGATON_STOP_FILE";

// While one exists, SIGINT and SIGTERM are caught; the previous handlers come back with its end.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // What asked this process to stop, "SIGINT" or "SIGTERM" (a signal, or a supervisor's stop file);
  // "" while nothing has. Cheap enough for every step: a flag and one stat().
  std::string requested() const;

 private:
  std::string stop_file_;  // MEGATON_STOP_FILE, "" when unset
};

}  // namespace megaton::train
