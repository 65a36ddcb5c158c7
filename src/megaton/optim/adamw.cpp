#include "megaton/optim/adamw.h"

#include <cmath>
#include <set>

#ifdef MEGATON_WITH_CUDA
#include "megaton/optim/cuda/adamw.h"
#endif

namespace megaton::optim {

void AdamW::check_config_and_names() const {
  MEGATON_CHECK(config_.beta1 >= 0 && config_.beta1 < 1, "AdamW beta1 must be in [0, 1), got ", config_.beta1);
  MEGATON_CHECK(config_.beta2 >= 0 && config_.beta2 < 1, "AdamW beta2 must be in [0, 1), got ", config_.beta2);
  MEGATON_CHECK(config_.eps >= 0, "AdamW eps must be >= 0, got ", config_.eps);
  MEGATON_CHECK(config_.weight_decay >= 0, "AdamW weight_decay must be >= 0, got ", config_.weight_decay);
  std::set<std::string> names;
  for (const nn::Parameter* p : params_) {
    MEGATON_CHECK(p != nullptr, "AdamW given a null parameter");
    // State is saved under the parameter's name, so two parameters may not share one.
    MEGATON_CHECK(names.insert(p->name).second, "AdamW given parameter '", p->name, "' twice");
    p->grad.expect_shape(p->value.shape());
    // One device for everything a step touches (the moments are allocated there).
    for (const Tensor* t : {&p->value, &p->grad})
      MEGATON_CHECK(t->device() == params_.front()->value.device(), "AdamW parameter '", p->name, "' has tensor '",
                    t->name(), "' on ", t->device().str(), ", the first parameter is on ",
                    params_.front()->value.device().str());
  }
}

AdamW::AdamW(nn::ParameterList params, AdamWConfig config) : params_(std::move(params)), config_(config) {
  check_config_and_names();
  for (nn::Parameter* p : params_) {
    exp_avg_.push_back(
        Tensor::zeros(p->value.shape(), DType::F32, MemCategory::Optimizer, p->name + ".exp_avg", p->value.device()));
    exp_avg_sq_.push_back(Tensor::zeros(p->value.shape(), DType::F32, MemCategory::Optimizer, p->name + ".exp_avg_sq",
                                        p->value.device()));
    segments_.push_back({p->value, p->grad, exp_avg_.back(), exp_avg_sq_.back(), p->weight_decay});
  }
}

AdamW::AdamW(const nn::ParamAndGradBuffer& buffer, AdamWConfig config) : params_(buffer.params()), config_(config) {
  check_config_and_names();
  const int64_t total = buffer.weights().numel();
  const Device device = buffer.weights().device();
  const Tensor m = Tensor::zeros({total}, DType::F32, MemCategory::Optimizer, "exp_avg_buffer", device);
  const Tensor v = Tensor::zeros({total}, DType::F32, MemCategory::Optimizer, "exp_avg_sq_buffer", device);
  for (nn::Parameter* p : params_) {
    const int64_t off = buffer.offset_of(*p);
    exp_avg_.push_back(m.window(off, p->value.shape(), p->name + ".exp_avg"));
    exp_avg_sq_.push_back(v.window(off, p->value.shape(), p->name + ".exp_avg_sq"));
  }
  // Runs of neighbours with the same decay flag, each reaching to the next run's start: the
  // alignment gaps in between hold zero weights and zero grads, which the update keeps at zero.
  for (size_t i = 0; i < params_.size();) {
    size_t j = i + 1;
    while (j < params_.size() && params_[j]->weight_decay == params_[i]->weight_decay) ++j;
    const int64_t begin = buffer.offset_of(*params_[i]);
    const int64_t end = j < params_.size() ? buffer.offset_of(*params_[j]) : total;
    const std::string what = "adamw run from " + params_[i]->name;
    segments_.push_back({buffer.weights().window(begin, {end - begin}, what),
                         buffer.grads().window(begin, {end - begin}, what), m.window(begin, {end - begin}, what),
                         v.window(begin, {end - begin}, what), params_[i]->weight_decay});
    i = j;
  }
}

void AdamW::step(double lr, double grad_scale) {
  MEGATON_CHECK(lr >= 0, "AdamW step given lr ", lr);
  const int64_t t = steps_ + 1;
  // Scalars in double, applied in fp32 in the same operation order as PyTorch's single-tensor
  // AdamW (mul_, lerp_, mul_/addcmul_, sqrt/div/add, addcdiv_), so results track it to rounding.
  const float b2 = static_cast<float>(config_.beta2);
  const float one_minus_b1 = static_cast<float>(1.0 - config_.beta1);
  const float one_minus_b2 = static_cast<float>(1.0 - config_.beta2);
  const float eps = static_cast<float>(config_.eps);
  const float gs = static_cast<float>(grad_scale);
  const bool scaled = grad_scale != 1.0;
  const float neg_step_size = static_cast<float>(-lr / (1.0 - std::pow(config_.beta1, static_cast<double>(t))));
  const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(config_.beta2, static_cast<double>(t))));
  const Device device = segments_.empty() ? Device::cpu() : segments_.front().w.device();
  if (device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    // The same scalars, one multi-tensor kernel over every segment (on the default stream).
    std::vector<cuda::AdamWSegment> segs;
    for (const Segment& s : segments_)
      segs.push_back({s.w.data<float>(), s.g.data<float>(), s.m.data<float>(), s.v.data<float>(), s.w.numel(),
                      s.decay ? static_cast<float>(1.0 - lr * config_.weight_decay) : 1.0f});
    cuda::adamw_step(device.index, nullptr, segs,
                     {b2, one_minus_b1, one_minus_b2, eps, neg_step_size, bc2_sqrt, gs, scaled});
    steps_ = t;
    return;
#else
    fail("AdamW step on ", device.str(), ", but this Megaton was built without CUDA");
#endif
  }
  for (const Segment& s : segments_) {
    const float decay = s.decay ? static_cast<float>(1.0 - lr * config_.weight_decay) : 1.0f;
    float* w = s.w.data<float>();
    const float* g = s.g.data<float>();
    float* m = s.m.data<float>();
    float* v = s.v.data<float>();
    const int64_t n = s.w.numel();
    // Elementwise, so the result does not depend on how elements are split across threads.
#pragma omp parallel for schedule(static) if (n >= 4096)
    for (int64_t j = 0; j < n; ++j) {
      const float gj = scaled ? g[j] * gs : g[j];
      w[j] *= decay;
      m[j] += one_minus_b1 * (gj - m[j]);  // lerp toward g: b1 * m + (1 - b1) * g
      v[j] = v[j] * b2 + one_minus_b2 * gj * gj;
      const float denom = std::sqrt(v[j]) / bc2_sqrt + eps;
      w[j] += neg_step_size * (m[j] / denom);
    }
  }
  steps_ = t;
}

std::vector<std::pair<std::string, Tensor>> AdamW::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back(exp_avg_[i].name(), exp_avg_[i]);
    out.emplace_back(exp_avg_sq_[i].name(), exp_avg_sq_[i]);
  }
  return out;
}

void AdamW::load_state(const std::map<std::string, Tensor>& tensors, int64_t step) {
  MEGATON_CHECK(step >= 0, "AdamW step count must be >= 0, got ", step);
  // Check every key before copying any, so a bad checkpoint leaves the state untouched.
  std::vector<std::pair<Tensor*, const Tensor*>> copies;
  for (auto* states : {&exp_avg_, &exp_avg_sq_}) {
    for (Tensor& dst : *states) {
      auto it = tensors.find(dst.name());
      if (it == tensors.end()) fail("optimizer state '", dst.name(), "' missing from the loaded tensors");
      if (it->second.shape() != dst.shape())
        fail("optimizer state '", dst.name(), "' has shape ", shape_str(it->second.shape()), ", expected ",
             shape_str(dst.shape()));
      copies.emplace_back(&dst, &it->second);
    }
  }
  for (auto& [dst, src] : copies) dst->copy_from(*src);
  steps_ = step;
}

}  // namespace megaton::optim
