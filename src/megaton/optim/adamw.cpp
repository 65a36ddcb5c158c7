#include "megaton/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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

AdamW::AdamW(const nn::ParamAndGradBuffer& buffer, AdamWConfig config)
    : AdamW(buffer, config, {nn::ElementRange{0, buffer.weights().numel()}}) {}

AdamW::AdamW(const nn::ParamAndGradBuffer& buffer, AdamWConfig config, std::vector<nn::ElementRange> owned)
    : params_(buffer.params()), config_(config), owned_(std::move(owned)) {
  check_config_and_names();
  const int64_t total = buffer.weights().numel();
  const Device device = buffer.weights().device();
  int64_t local = 0;
  for (size_t k = 0; k < owned_.size(); ++k) {
    const nn::ElementRange& r = owned_[k];
    MEGATON_CHECK(r.numel >= 0 && r.offset >= (k == 0 ? 0 : owned_[k - 1].end()) && r.end() <= total,
                  "AdamW owned range ", k, " [", r.offset, ", ", r.end(), ") is out of order or outside the buffer of ",
                  total, " elements");
    local += r.numel;
  }
  sharded_ = !(owned_.size() == 1 && owned_[0] == nn::ElementRange{0, total});
  m_ = Tensor::zeros({local}, DType::F32, MemCategory::Optimizer, "exp_avg_buffer", device);
  v_ = Tensor::zeros({local}, DType::F32, MemCategory::Optimizer, "exp_avg_sq_buffer", device);
  for (nn::Parameter* p : params_) {
    param_offsets_.push_back(buffer.offset_of(*p));
    if (sharded_) continue;
    exp_avg_.push_back(m_.window(param_offsets_.back(), p->value.shape(), p->name + ".exp_avg"));
    exp_avg_sq_.push_back(v_.window(param_offsets_.back(), p->value.shape(), p->name + ".exp_avg_sq"));
  }
  // Runs of neighbours with the same decay flag, each reaching to the next run's start: the
  // alignment gaps in between hold zero weights and zero grads, which the update keeps at zero.
  // Each owned range is cut where it crosses from one run into the next.
  int64_t range_local = 0;  // where owned_[k] starts in the flat moments
  size_t k = 0;
  for (size_t i = 0; i < params_.size() && k < owned_.size();) {
    size_t j = i + 1;
    while (j < params_.size() && params_[j]->weight_decay == params_[i]->weight_decay) ++j;
    const int64_t run_begin = param_offsets_[i];
    const int64_t run_end = j < params_.size() ? param_offsets_[j] : total;
    // Every owned range that overlaps [run_begin, run_end), clipped to it.
    for (; k < owned_.size(); range_local += owned_[k].numel, ++k) {
      const nn::ElementRange& r = owned_[k];
      const int64_t begin = std::max(r.offset, run_begin), end = std::min(r.end(), run_end);
      if (begin < end) {
        const std::string what = "adamw run from " + params_[i]->name;
        const int64_t at = range_local + (begin - r.offset);
        segments_.push_back({buffer.weights().window(begin, {end - begin}, what),
                             buffer.grads().window(begin, {end - begin}, what), m_.window(at, {end - begin}, what),
                             v_.window(at, {end - begin}, what), params_[i]->weight_decay});
      }
      if (r.end() > run_end) break;  // the rest of this range lies in later runs
    }
    i = j;
  }
}

const Tensor& AdamW::exp_avg(size_t i) const {
  MEGATON_CHECK(!sharded_, "a sharded AdamW has no per-parameter moments");
  return exp_avg_.at(i);
}

const Tensor& AdamW::exp_avg_sq(size_t i) const {
  MEGATON_CHECK(!sharded_, "a sharded AdamW has no per-parameter moments");
  return exp_avg_sq_.at(i);
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
  MEGATON_CHECK(!sharded_, "a sharded AdamW has no per-parameter moments: save_state gives its owned elements");
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back(exp_avg_[i].name(), exp_avg_[i]);
    out.emplace_back(exp_avg_sq_[i].name(), exp_avg_sq_[i]);
  }
  return out;
}

std::vector<StateTensorSpec> AdamW::state_specs() const {
  std::vector<StateTensorSpec> out;
  for (const nn::Parameter* p : params_) {
    out.push_back({p->name + ".exp_avg", p->value.shape()});
    out.push_back({p->name + ".exp_avg_sq", p->value.shape()});
  }
  return out;
}

namespace {

// memcpy of n floats in 1 MiB chunks across threads: one thread does not saturate memory
// bandwidth, and a snapshot stalls the step for this copy.
void copy_floats(float* dst, const float* src, int64_t n) {
  constexpr int64_t kChunk = (int64_t{1} << 20) / sizeof(float);
#pragma omp parallel for schedule(static) if (n > 4 * kChunk)
  for (int64_t c = 0; c < (n + kChunk - 1) / kChunk; ++c)
    std::memcpy(dst + c * kChunk, src + c * kChunk, static_cast<size_t>(std::min(kChunk, n - c * kChunk)) * sizeof(float));
}

// Calls f(range index, first element in the parameter, first element in the flat moments, count)
// for every piece of [param, param + numel) that the owned ranges cover.
template <typename F>
void for_owned_pieces(const std::vector<nn::ElementRange>& owned, int64_t param, int64_t numel, F&& f) {
  int64_t local = 0;
  for (size_t k = 0; k < owned.size(); local += owned[k].numel, ++k) {
    const int64_t begin = std::max(owned[k].offset, param), end = std::min(owned[k].end(), param + numel);
    if (begin < end) f(begin - param, local + (begin - owned[k].offset), end - begin);
  }
}

}  // namespace

void AdamW::save_state(const std::vector<std::pair<std::string, Tensor>>& into) const {
  const auto specs = state_specs();
  MEGATON_CHECK(into.size() == specs.size(), "AdamW state saved into ", into.size(), " tensors, it has ", specs.size());
  for (size_t s = 0; s < specs.size(); ++s) {
    const Tensor& dst = into[s].second;
    MEGATON_CHECK(dst.shape() == specs[s].shape && dst.dtype() == DType::F32 && dst.device().is_cpu(),
                  "AdamW state '", specs[s].name, "' saved into '", into[s].first, "' (", dtype_name(dst.dtype()), " ",
                  shape_str(dst.shape()), " on ", dst.device().str(), "), expected f32 ",
                  shape_str(specs[s].shape), " on the host");
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    for (int which = 0; which < 2; ++which) {
      const Tensor& dst = into[2 * i + which].second;
      if (!sharded_) {
        const Tensor& src = which == 0 ? exp_avg_[i] : exp_avg_sq_[i];
        if (src.device().is_cpu()) copy_floats(dst.data<float>(), src.data<float>(), src.numel());
        else Tensor(dst).copy_from(src);  // a handle to the same storage
        continue;
      }
      const float* flat = (which == 0 ? m_ : v_).data<float>();
      for_owned_pieces(owned_, param_offsets_[i], dst.numel(), [&](int64_t at, int64_t local, int64_t n) {
        copy_floats(dst.data<float>() + at, flat + local, n);
      });
    }
  }
}

void AdamW::load_state(const std::map<std::string, Tensor>& tensors, int64_t step) {
  MEGATON_CHECK(step >= 0, "AdamW step count must be >= 0, got ", step);
  // Check every key before copying any, so a bad checkpoint leaves the state untouched.
  const auto specs = state_specs();
  std::vector<const Tensor*> sources;
  for (const StateTensorSpec& spec : specs) {
    auto it = tensors.find(spec.name);
    if (it == tensors.end()) fail("optimizer state '", spec.name, "' missing from the loaded tensors");
    if (it->second.shape() != spec.shape)
      fail("optimizer state '", spec.name, "' has shape ", shape_str(it->second.shape()), ", expected ",
           shape_str(spec.shape));
    sources.push_back(&it->second);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    for (int which = 0; which < 2; ++which) {
      const Tensor& src = *sources[2 * i + which];
      if (!sharded_) {
        (which == 0 ? exp_avg_ : exp_avg_sq_)[i].copy_from(src);
        continue;
      }
      const Tensor f32 = src.dtype() == DType::F32 && src.device().is_cpu() ? src : src.to(DType::F32);
      float* flat = (which == 0 ? m_ : v_).data<float>();
      for_owned_pieces(owned_, param_offsets_[i], src.numel(), [&](int64_t at, int64_t local, int64_t n) {
        copy_floats(flat + local, f32.data<float>() + at, n);
      });
    }
  }
  steps_ = step;
}

}  // namespace megaton::optim
