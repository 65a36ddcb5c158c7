// `megaton train --max-restarts R`: the training runs in a child process (this executable,
// re-run with the same arguments); when the child dies (a signal, a non-zero exit) it is started
// again with --resume auto, continuing from the newest valid checkpoint, up to R times. A child
// that dies before it wrote anything to the run's metrics file failed while setting up (config,
// data, checkpoint errors): that would only repeat, so it is not restarted. SIGINT and SIGTERM
// are passed on to the child and end the supervision instead of restarting.
#pragma once
#include <string>
#include <vector>

namespace megaton::train {

// `args` and `restart_args` exclude the program name. Returns once a child exits with status 0;
// throws when the child keeps dying (R restarts used up) or was stopped by SIGINT/SIGTERM.
void supervise(const std::vector<std::string>& args, const std::vector<std::string>& restart_args, int max_restarts,
               const std::string& metrics_path);

}  // namespace megaton::train
