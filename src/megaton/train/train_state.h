// Where training stands apart from the tensors: the step, the position in the sample stream and
// the rewind bookkeeping; with the weights and the optimizer moments, everything needed to go on
// bit for bit. Saved as a checkpoint's state.json.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megaton/train/anomaly_detector.h"
#include "megaton/train/train_config.h"

namespace megaton::train {

struct TrainProgress {
  int64_t step = 0;              // steps done (including ones whose update was skipped)
  // The data position, kept here and only here: the next batch starts at this position of the
  // sample stream (TrainingData::train), unless a rewind marked that batch to be skipped.
  int64_t consumed_samples = 0;
  std::vector<int64_t> skipped_batches;  // first stream positions of the batches rewinds skipped
  int64_t rewinds = 0;
  // After a rewind the lr is multiplied by lr_factor for steps lr_factor_from .. lr_factor_until.
  double lr_factor = 1.0;
  int64_t lr_factor_from = 0, lr_factor_until = 0;
  AnomalyWindow recent;          // the anomaly detector's history
  std::vector<double> loss_scaler;  // FP16's optim::LossScaler::state() after the step (empty without)

  // First stream position of the next batch of `batch_size` samples, past skipped batches.
  int64_t next_batch(int64_t batch_size) const;
  double lr_multiplier(int64_t step) const {
    return step >= lr_factor_from && step <= lr_factor_until ? lr_factor : 1.0;
  }
};

// state.json: the progress plus what makes it meaningful (the seed the sample order derives
// from, the optimizer's step count, the resolved config) and a "precision" object holding FP16's
// loss scaler state (empty otherwise; FP8's state is fp8_state.safetensors).
nlohmann::json state_to_json(const TrainProgress& p, const TrainConfig& cfg, int64_t optimizer_steps);
// Reads it back, checking that the seed matches cfg (the sample order would differ otherwise);
// errors name `source`. *optimizer_steps receives the optimizer's step count.
TrainProgress state_from_json(const nlohmann::json& j, const TrainConfig& cfg, const std::string& source,
                              int64_t* optimizer_steps);

}  // namespace megaton::train
