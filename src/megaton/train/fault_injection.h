// Faults injected on purpose (`megaton train --inject SPEC`), so tests can show that rewind,
// restart and checkpoint integrity turn each one into a non-event. SPEC is one of
//   nan@step=N      the gradients and loss of step N become NaN
//   spike@step=N    the loss and gradients of step N are multiplied by 10
//   crash@step=N    the process kills itself (SIGKILL) as step N begins
//   crash@save[=N]  the process kills itself halfway through writing a checkpoint (of step N)
//   fail@save[=N]   one attempt at writing a checkpoint (of step N) fails with an I/O error
//   slow@save=S     every checkpoint write takes S seconds longer (a slow file system)
// Each fault except slow@save fires once per run directory: firing is recorded in
// RUN/injected_faults before it takes effect, so a restarted or resumed run does not meet it
// again (otherwise a crash would recur on every restart).
#pragma once
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "megaton/core/tensor.h"

namespace megaton::train {

enum class Fault { Nan, Spike, CrashAtStep, CrashInSave, FailSave };

class FaultInjector {
 public:
  // Parses every spec (errors name the bad one); reads the faults already fired in run_dir.
  FaultInjector(const std::vector<std::string>& specs, const std::string& run_dir);

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
    int64_t step;  // -1: any step (crash@save, fail@save without =N)
  };
  std::vector<Spec> specs_;
  double save_delay_s_ = 0;
  std::string record_path_;
  std::set<std::string> fired_;
  std::mutex mutex_;
};

}  // namespace megaton::train
