// `megaton train --max-restarts R` / `--nproc N`: the training runs as a child command (this
// executable re-run with the same arguments, or a launcher such as `mpirun -np N` starting it on N
// ranks); when the child dies (a signal, a non-zero exit: for a job, any rank's death ends the job
// and its launcher exits non-zero) it is started again with --resume auto, continuing from the
// newest valid checkpoint, up to R times. A child that dies before it wrote anything to the run's
// metrics file failed while setting up (config, data, checkpoint errors): that would only repeat,
// so it is not restarted. Nor is a child stopped by the user: the first SIGINT / SIGTERM sent to the
// supervisor asks the child to stop after its step with a checkpoint, through the stop file of
// stop_signal.h (RUN/stop_requested.PID), which reaches every rank of a launcher's job; a second ends
// the child at once. The child runs in its own process group, so a terminal's Ctrl-C reaches it
// only through here. A child that exits with kStoppedExitStatus, or that a signal ended, ends the
// supervision.
#pragma once
#include <string>
#include <vector>

namespace megaton::train {

// `command` and `restart_command` are whole command lines: the program (looked up in PATH when it
// has no '/') and its arguments. Returns true once a child exits with status 0, false when it was
// stopped by a signal after writing its checkpoint; throws when the child keeps dying (R restarts
// used up) or was ended by a signal without stopping cleanly.
bool supervise(const std::vector<std::string>& command, const std::vector<std::string>& restart_command,
               int max_restarts, const std::string& metrics_path);

// The path of the running executable (/proc/self/exe), for re-running it.
std::string self_executable();

// The words that start a job of `nproc` ranks, to be followed by the program and its arguments.
// `launcher` empty: `mpirun -np N -x MEGATON_STOP_FILE` (the supervisor's stop requests reach ranks on
// other hosts), plus --allow-run-as-root --oversubscribe when running as root
// (Open MPI refuses root otherwise; a container's root usually has fewer cores than ranks). Else the
// launcher's command split at whitespace (no quoting), every {nproc} in it replaced by N, e.g.
// "srun --mpi=pmix -n {nproc}" or "srun --mpi=pmix -n 4". Its program must be found (in PATH when it
// has no '/'); errors name the launcher.
std::vector<std::string> launch_command(const std::string& launcher, int nproc);

}  // namespace megaton::train
