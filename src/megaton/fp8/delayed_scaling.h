// TransformerEngine's delayed scaling for one FP8 tensor (a GEMM input, weight or gradient): the
// scale used in step t comes from the amaxes recorded in earlier steps, so quantising never waits
// for the tensor's own amax. Per step:
//   1. every quantisation of the tensor records its amax into the newest history slot (max of all
//      records in the step: micro-batches, recomputes);
//   2. the trainer may reduce that slot (max) over the tensor- and data-parallel groups, so every
//      rank uses the same scale;
//   3. update(): amax = max over the history ("max") or the newest slot ("most_recent");
//      scale = (fp8_max / amax) / 2^margin, the previous scale kept when amax is 0, inf or NaN;
//      then the history rolls by one and the new newest slot starts at 0.
// Until an update has seen a valid amax there is no scale (TransformerEngine starts every scale at
// 1 instead): the linear calibrates, running its GEMMs in the compute precision while recording
// amaxes (LinearQuantizer::calibrating). A scale of 1 would flush most E5M2 gradients of a freshly
// initialised model (|g| ~ 1e-5, below E5M2's smallest normal 6.1e-5) to zero in step 1, and that
// first step's near-empty Adam moments cost several percent of validation loss on short runs.
// Megatron's names: fp8_margin, fp8_amax_history_len, fp8_amax_compute_algo.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "megaton/core/fp8_format.h"

namespace megaton::fp8 {

enum class AmaxAlgo : uint8_t { Max, MostRecent };
AmaxAlgo amax_algo_from_name(std::string_view name);  // "max" | "most_recent"

struct DelayedScalingConfig {
  int margin = 0;            // scale divided by 2^margin: headroom for amax growth between updates
  int history_len = 1;       // Megatron's default (TE's own default is 1024)
  AmaxAlgo algo = AmaxAlgo::MostRecent;
  void validate() const;     // margin in [0, 64], history_len in [1, 65536]
};

class DelayedScaling {
 public:
  DelayedScaling(Format format, DelayedScalingConfig config);

  Format format() const { return format_; }
  // None until an update has seen a valid amax.
  std::optional<float> scale() const { return scale_; }
  // Step 1: fold an observed amax into the newest slot (NaN sticks until update() sees it).
  void record(float amax);
  float newest_amax() const { return history_[head_]; }
  // Step 2: replace the newest slot with the group's reduced value.
  void set_newest_amax(float amax) { history_[head_] = amax; }
  // Step 3.
  void update();

  // The whole state (scale, 0 for none yet, then the history oldest to newest) for checkpoints;
  // load restores it bitwise and checks the history length.
  std::vector<float> state() const;
  void load_state(const std::vector<float>& state);

 private:
  Format format_;
  DelayedScalingConfig config_;
  std::vector<float> history_;  // a ring; head_ is the newest slot
  size_t head_ = 0;
  std::optional<float> scale_;
};

}  // namespace megaton::fp8
