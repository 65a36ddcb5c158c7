// The training loop: config -> model, optimizer, data, schedule; runs steps with gradient
// accumulation, logs metrics, evaluates, exports HF-format checkpoints.
#pragma once
#include <memory>
#include <string>

#include "megaton/data/token_stream.h"
#include "megaton/models/transformer_model.h"
#include "megaton/optim/adamw.h"
#include "megaton/optim/lr_schedule.h"
#include "megaton/train/metrics_log.h"
#include "megaton/train/sample_order.h"
#include "megaton/train/train_config.h"

namespace megaton::train {

struct TrainSummary {
  int64_t steps = 0;
  double final_loss = 0;      // training loss of the last step
  double final_val_loss = -1; // -1 when there is no validation data
  double tokens_per_s = 0;    // median over logged steps
  std::string sample;         // generated text (when sample.tokens > 0)
};

class Trainer {
 public:
  // Opens the data and builds the model; every error in config or data surfaces here, before
  // anything is written to the run directory.
  explicit Trainer(TrainConfig config);
  TrainSummary run();

 private:
  void train_step(int64_t step, std::vector<double>& rates);
  double validation_loss();
  void save(const std::string& dir);

  TrainConfig cfg_;
  std::unique_ptr<data::TokenStream> train_data_, valid_data_;
  std::unique_ptr<models::TransformerModel> model_;
  std::unique_ptr<optim::AdamW> optimizer_;
  optim::LRSchedule schedule_;
  std::unique_ptr<SampleOrder> order_;
  std::unique_ptr<MetricsLog> metrics_;
  double peak_gflops_ = 0;
  double last_loss_ = 0;
};

}  // namespace megaton::train
