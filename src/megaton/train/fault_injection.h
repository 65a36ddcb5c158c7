// Faults injected on purpose (`megaton train --inject SPEC`), so tests can show that rewind,
// restart and checkpoint integrity turn each one into a non-event. SPEC is one of
//   nan@step=N      the gradients and loss of step N become NaN
//   spike@step=N    the loss and gradients of step N are multiplied by 10
//   crash@step=N    the process kills itself (SIGKILL) as step N begins
//   sigterm@step=N  the process sends itself SIGTERM as step N begins (a stop asked for by the user)
//   crash@save[=N]  the process kills itself halfway through writing a checkpoint (of step N)
//   fail@save[=N]   one attempt at writing a checkpoint (of step N) fails with an I/O error
//   slow@save=S     every checkpoint write takes S seconds longer (a slow file system)
//   fail@final      one attempt at writing the final model (RUN/final) fails with an I/O error
// followed by an optional qualifier `,rank=R`: under data parallelism the fault then happens on
// rank R alone (nan@step=5,rank=1 poisons rank 1's gradients after the reduction, as a fault in
// one machine would; crash@step=7,rank=1 kills rank 1 only); without it every rank meets it.
// Checkpoints and the final model are written by rank 0 alone, so the @save and @final faults take
// no rank other than 0.
// Each fault except slow@save fires once per run directory: firing is recorded before it takes
// effect (rank 0 in RUN/injected_faults, rank R > 0 in RUN/injected_faults.rankR; a fault recorded
// in any of them counts as fired on every rank), so a restarted or resumed run does not meet it
// again (otherwise a crash would recur on every restart).
#pragma once
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "megaton/core/tensor.h"

namespace megaton::train {

enum class Fault { Nan, Spike, CrashAtStep, SignalAtStep, CrashInSave, FailSave, FailFinal };

class FaultInjector {
 public:
  // Parses every spec (errors name the bad one); reads the faults already fired in run_dir. rank and
  // world_size: this process's place in the job (a spec's rank=R must be below world_size).
  FaultInjector(const std::vector<std::string>& specs, const std::string& run_dir, int rank = 0, int world_size = 1);
  // Only the parsing and range checks, for a launcher to refuse bad specs before it starts the job.
  static void validate(const std::vector<std::string>& specs, int world_size);

  // True, once, when a fault of this kind is due at `step` (and not yet fired in this run
  // directory). Thread-safe: the checkpoint writer thread asks too.
  bool fire(Fault kind, int64_t step);
  double save_delay_s() const { return save_delay_s_; }
  // The training step's gradient hook: when due at `step`, nan@ poisons one gradient element and the
  // loss, spike@ multiplies every gradient and the loss by 10.
  void corrupt_gradients(int64_t step, const Tensor& grads, double& loss);
  // Kills the process the way a crashed node would die: SIGKILL, no cleanup, no flush.
  [[noreturn]] static void crash(const std::string& why);

 private:
  struct Spec {
    std::string text;
    Fault kind;
    int64_t step;  // -1: any step (crash@save, fail@save without =N, fail@final)
    int rank;      // -1: every rank
  };
  // Appends the spec's fault (none for slow@save, which sets save_delay_s) to specs.
  static void parse(const std::string& spec, int world_size, std::vector<Spec>& specs, double& save_delay_s);
  std::vector<Spec> specs_;
  int rank_;
  double save_delay_s_ = 0;
  std::string record_path_;
  std::set<std::string> fired_;
  std::mutex mutex_;
};

}  // namespace megaton::train
