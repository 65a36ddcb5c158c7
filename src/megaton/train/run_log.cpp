#include "megaton/train/run_log.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "megaton/core/allocator.h"

namespace megaton::train {

namespace {

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, s / 60 % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  return buf;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<int64_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace

RunLog::RunLog(const TrainConfig& cfg, double flops_per_token, double peak_gflops, bool primary,
               parallel::Communicator* world)
    : cfg_(cfg), flops_per_token_(flops_per_token), peak_gflops_(peak_gflops), primary_(primary), world_(world) {}

void RunLog::open(bool resuming) {
  metrics_ = std::make_unique<MetricsLog>(
      primary_ ? (std::filesystem::path(cfg_.run_dir) / "metrics.jsonl").string() : std::string(), resuming);
}

double RunLog::median_tokens_per_s() const { return median(rates_); }

void RunLog::step(int64_t step, const TrainingStep::Result& r, double lr, int64_t consumed_samples) {
  const double tokens = static_cast<double>(cfg_.global_batch_size * cfg_.seq_length);
  const double tok_s = tokens / r.seconds;
  const double gflops = tok_s * flops_per_token_ / 1e9;
  rates_.push_back(tok_s);
  last_loss_ = r.loss;
  nlohmann::json rec = {{"step", step},
                        {"loss", r.loss},
                        {"lr", lr},
                        {"grad_norm", r.grad_norm},
                        {"tokens_per_s", tok_s},
                        {"tflops", gflops / 1e3},
                        {"mfu", gflops / peak_gflops_},
                        {"step_time_s", r.seconds},
                        {"consumed_samples", consumed_samples},
                        {"time", unix_time()}};
  if (cfg_.data_parallel_size > 1 || cfg_.tensor_model_parallel_size > 1) rec["comm_wait_s"] = r.comm_wait_seconds;
  if (r.loss_scale > 0) rec["loss_scale"] = r.loss_scale;
  if (r.skipped) rec["skipped"] = "fp16 gradient overflow: no update, loss scale lowered";
  // Optimizer post-validation: whether the eager update stood or was undone and taken again.
  if (cfg_.optimizer_post_validation) rec["post_validation"] = r.updated ? "kept" : "redone";
  if (rates_.size() == 1) {
    // After this process's first step every category has reached its steady-state peak: the
    // per-rank memory by category (Megatron's memory report), in MB.
    const MemStats mem = Allocator::host().stats();
    nlohmann::json peak;
    for (size_t c = 0; c < kNumMemCategories; ++c)
      peak[std::string(mem_category_name(static_cast<MemCategory>(c)))] = static_cast<double>(mem.peak[c]) / 1e6;
    rec["peak_memory_mb"] = peak;
    // The largest process's total peak (all categories at once).
    const double total = static_cast<double>(mem.total_peak);
    rec["peak_memory_bytes"] = world_ ? world_->all_reduce_scalar(total, parallel::ReduceOp::Max) : total;
  }
  if (!r.moe.empty()) {
    // Per MoE layer (in layer order): how unevenly the router loaded the experts, what capacity
    // dropped, and the balancing losses (not part of "loss"); under expert parallelism the seconds
    // this rank was blocked on the token dispatcher's communication (part of comm_wait_s).
    nlohmann::json layers = nlohmann::json::array();
    for (const nn::MoeStats& m : r.moe) {
      layers.push_back({{"max_over_mean_load", m.mean_load > 0 ? m.max_load / m.mean_load : 0.0},
                        {"dropped_tokens", m.dropped},
                        {"balance_loss", m.balance_loss},
                        {"z_loss", m.z_loss}});
      if (cfg_.expert_model_parallel_size > 1) layers.back()["dispatch_wait_s"] = m.comm_seconds;
    }
    rec["moe"] = layers;
  }
  if (!r.mtp_losses.empty()) rec["mtp_loss"] = r.mtp_losses;
  metrics_->write(rec);
  if (primary_ && (step % cfg_.log_interval == 0 || step == cfg_.train_iters)) {
    const double rate = median(rates_);
    const double eta = rate > 0 ? static_cast<double>(cfg_.train_iters - step) * tokens / rate : 0;
    std::printf("step %5ld/%ld | loss %.4f | lr %.3e | grad norm %.3f | %.0f tok/s | %.3f TFLOP/s | MFU %.1f%% | "
                "ETA %s\n",
                step, cfg_.train_iters, r.loss, lr, r.grad_norm, tok_s, gflops / 1e3, 100.0 * gflops / peak_gflops_,
                format_duration(eta).c_str());
    std::fflush(stdout);
  }
}

void RunLog::validation(int64_t step, double loss, bool final) {
  if (final) {
    metrics_->write({{"step", step}, {"val_loss", loss}, {"final", true}});
    return;
  }
  metrics_->write({{"step", step}, {"val_loss", loss}});
  if (primary_) std::printf("step %5ld | validation loss %.4f\n", step, loss);
}

}  // namespace megaton::train
