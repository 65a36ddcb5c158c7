// Decides whether a training step went wrong: a non-finite loss or gradient norm, or a spike,
// i.e. a loss or grad norm more than `zscore` standard deviations above the mean of the last
// `window` normal steps. The window itself is training state (TrainProgress::recent), so it is
// rewound, checkpointed and resumed with everything else and decisions replay exactly.
#pragma once
#include <cstdint>
#include <deque>
#include <string>

#include "megaton/parallel/communicator.h"

namespace megaton::train {

struct AnomalyWindow {
  std::deque<double> losses;
  std::deque<double> grad_norms;
};

class AnomalyDetector {
 public:
  AnomalyDetector(int64_t window, double zscore);
  // Empty when the step is normal, else why not ("loss is nan", "grad norm 41.2 is 9.3 standard
  // deviations above ..."). Spikes are judged only once the window is full: early training moves
  // too fast for a short history to say what is normal.
  std::string check(const AnomalyWindow& recent, double loss, double grad_norm) const;
  // The non-finite part of check alone: what a run without rewind stops on.
  static std::string non_finite(double loss, double grad_norm);
  // Adds a normal step's values, dropping the oldest beyond the window.
  void accept(AnomalyWindow& recent, double loss, double grad_norm) const;

 private:
  int64_t window_;
  double zscore_;
};

// Every rank of a job must take the same decision, or one rewinds (or stops) while the others step on
// (and the job deadlocks or its replicas part ways). Used for anomalies, for a stop signal that may
// have reached one rank alone, and for non-finite weights before a save. The ranks see the same averaged loss and, from the
// reduced gradients, the same grad norm, so they normally agree already; a fault on one rank after
// the reduction (a NaN or a spike in its gradients or loss) is seen by that rank alone. Given this
// rank's verdict (empty: normal), returns the group's: the verdict of the lowest rank that saw an
// anomaly, as "rank R: <its reason>" (the same text on every rank), or empty when no rank saw one;
// a group of one returns `why` as it is. A collective: every rank calls it for every step it checks.
std::string agree_on_anomaly(parallel::Communicator& group, const std::string& why);

}  // namespace megaton::train
