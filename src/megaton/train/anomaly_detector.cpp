#include "megaton/train/anomaly_detector.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "megaton/core/tensor.h"

namespace megaton::train {

namespace {

// How far above the window's mean `x` lies, in standard deviations, and a description of it.
std::string spike(const char* what, const std::deque<double>& values, double x, double limit) {
  double mean = 0, var = 0;
  for (double v : values) mean += v;
  mean /= static_cast<double>(values.size());
  for (double v : values) var += (v - mean) * (v - mean);
  // A flat window (std ~ 0) would turn rounding noise into huge z-scores: deviations below 0.1%
  // of the mean never count.
  const double sd = std::max(std::sqrt(var / static_cast<double>(values.size())), 1e-3 * std::abs(mean));
  const double z = (x - mean) / sd;
  if (z <= limit) return {};
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s %.4g is %.1f standard deviations above the mean %.4g of the last %zu steps", what,
                x, z, mean, values.size());
  return buf;
}

}  // namespace

AnomalyDetector::AnomalyDetector(int64_t window, double zscore) : window_(window), zscore_(zscore) {}

std::string AnomalyDetector::non_finite(double loss, double grad_norm) {
  if (!std::isfinite(loss)) return "loss is " + std::to_string(loss);
  if (!std::isfinite(grad_norm)) return "grad norm is " + std::to_string(grad_norm);
  return {};
}

std::string AnomalyDetector::check(const AnomalyWindow& recent, double loss, double grad_norm) const {
  if (std::string why = non_finite(loss, grad_norm); !why.empty()) return why;
  if (static_cast<int64_t>(recent.losses.size()) < window_) return {};
  std::string why = spike("loss", recent.losses, loss, zscore_);
  return why.empty() ? spike("grad norm", recent.grad_norms, grad_norm, zscore_) : why;
}

void AnomalyDetector::accept(AnomalyWindow& recent, double loss, double grad_norm) const {
  recent.losses.push_back(loss);
  recent.grad_norms.push_back(grad_norm);
  while (static_cast<int64_t>(recent.losses.size()) > window_) {
    recent.losses.pop_front();
    recent.grad_norms.pop_front();
  }
}

std::string agree_on_anomaly(parallel::Communicator& group, const std::string& why) {
  const int n = group.size();
  if (n == 1) return why;
  const int first = static_cast<int>(
      group.all_reduce_scalar(why.empty() ? n : group.rank(), parallel::ReduceOp::Min));  // n: no rank saw one
  if (first == n) return {};
  // Only on the anomaly path: the deciding rank's reason travels to the others, so the metrics and
  // the message rank 0 writes say what happened where.
  constexpr int64_t kMaxReason = 512;
  Tensor text = Tensor::zeros({kMaxReason}, DType::U8, MemCategory::Other, "anomaly_reason");
  if (group.rank() == first) std::memcpy(text.raw(), why.data(), std::min<size_t>(why.size(), kMaxReason - 1));
  group.broadcast(text, first);
  const std::string reason(static_cast<const char*>(text.raw()));
  return "rank " + std::to_string(first) + ": " + reason;
}

}  // namespace megaton::train
