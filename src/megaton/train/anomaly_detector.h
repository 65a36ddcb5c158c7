// Decides whether a training step went wrong: a non-finite loss or gradient norm, or a spike,
// i.e. a loss or grad norm more than `zscore` standard deviations above the mean of the last
// `window` normal steps. The window itself is training state (TrainProgress::recent), so it is
// rewound, checkpointed and resumed with everything else and decisions replay exactly.
#pragma once
#include <cstdint>
#include <deque>
#include <string>

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
  // Adds a normal step's values, dropping the oldest beyond the window.
  void accept(AnomalyWindow& recent, double loss, double grad_norm) const;

 private:
  int64_t window_;
  double zscore_;
};

}  // namespace megaton::train
