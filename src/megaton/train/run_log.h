// What a training run reports as it goes: one JSON Lines record per step (loss, lr, grad norm,
// throughput, MFU), validation losses and events in RUN/metrics.jsonl, and the console progress
// line every logging.log_interval steps with an ETA from the median throughput so far.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "megaton/parallel/communicator.h"
#include "megaton/train/metrics_log.h"
#include "megaton/train/train_config.h"
#include "megaton/train/training_step.h"

namespace megaton::train {

class RunLog {
 public:
  // flops_per_token: training FLOPs per token of the model at the run's sequence length;
  // peak_gflops: what MFU divides by. Only the primary process (rank 0) writes the metrics file.
  // world (null: this process alone): every rank's step() joins a max of the memory peaks after the
  // first step, so the record names the largest rank's (what `megaton plan` predicts).
  RunLog(const TrainConfig& cfg, double flops_per_token, double peak_gflops, bool primary = true,
         parallel::Communicator* world = nullptr);
  // Opens RUN/metrics.jsonl: continued when resuming, started afresh otherwise.
  void open(bool resuming);
  MetricsLog& metrics() { return *metrics_; }

  void step(int64_t step, const TrainingStep::Result& r, double lr, int64_t consumed_samples);
  // A validation loss: every eval_interval steps, and once with final = true at the end.
  void validation(int64_t step, double loss, bool final);

  double median_tokens_per_s() const;
  double last_loss() const { return last_loss_; }

 private:
  const TrainConfig& cfg_;
  double flops_per_token_, peak_gflops_;
  bool primary_;
  parallel::Communicator* world_;
  std::unique_ptr<MetricsLog> metrics_;
  std::vector<double> rates_;  // tokens/s of every step logged by this process
  double last_loss_ = 0;
};

}  // namespace megaton::train
