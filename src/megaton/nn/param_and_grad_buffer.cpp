#include "megaton/nn/param_and_grad_buffer.h"

#include <algorithm>
#include <set>

namespace megaton::nn {

namespace {
int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }
}  // namespace

BufferLayout lay_out_buffer(const std::vector<BufferSlot>& slots, int64_t bucket_size, int64_t shards,
                            int64_t expert_shards) {
  if (expert_shards == 0) expert_shards = shards;
  MEGATON_CHECK(shards >= 1 && expert_shards >= 1, "gradient buffer needs at least one shard, got ", shards, " (",
                expert_shards, " for the experts)");
  constexpr int64_t kAlign = ParamAndGradBuffer::kAlignElements;
  // A bucket ends on a multiple of this, so it splits into its shards aligned (with one shard, the
  // alignment every parameter start has anyway: the layout of an unsharded buffer).
  const auto bucket_align = [&](bool expert) { return kAlign * (expert ? expert_shards : shards); };
  BufferLayout layout;
  int64_t total = 0;
  BucketSpan bucket;
  for (size_t i = 0; i < slots.size(); ++i) {
    int64_t offset = align_up(total, kAlign);
    const bool expert = slots[i].expert;
    const bool full = bucket_size > 0 && offset - bucket.offset >= bucket_size;
    if (bucket.count > 0 && (full || expert != bucket.expert)) {
      offset = bucket.offset + align_up(offset - bucket.offset, bucket_align(bucket.expert));
      bucket.numel = offset - bucket.offset;
      layout.buckets.push_back(bucket);
      bucket = BucketSpan{offset, 0, false, i, 0};
    }
    bucket.expert = expert;
    ++bucket.count;
    layout.offsets.push_back(offset);
    total = offset + slots[i].numel;
  }
  total = bucket.offset + align_up(total - bucket.offset, bucket_align(bucket.expert));
  bucket.numel = total - bucket.offset;
  if (bucket.count > 0) layout.buckets.push_back(bucket);
  layout.total = total;
  return layout;
}

ParamAndGradBuffer::ParamAndGradBuffer(const ParameterList& params, int64_t bucket_size, int64_t shards,
                                       int64_t expert_shards)
    : params_(params.rbegin(), params.rend()), shards_(shards), expert_shards_(expert_shards ? expert_shards : shards) {
  std::set<const Parameter*> seen;
  std::vector<BufferSlot> slots;
  for (Parameter* p : params_) {
    MEGATON_CHECK(p != nullptr && p->value.defined(), "gradient buffer given an undefined parameter");
    MEGATON_CHECK(seen.insert(p).second, "gradient buffer given parameter '", p->name, "' twice");
    MEGATON_CHECK(p->value.dtype() == DType::F32, "parameter '", p->name, "' main weight must be f32");
    slots.push_back({p->value.numel(), p->shard.group == ParallelGroup::Expert});
  }
  const BufferLayout layout = lay_out_buffer(slots, bucket_size, shards_, expert_shards_);
  offsets_ = layout.offsets;
  for (const BucketSpan& span : layout.buckets) {
    GradBucket bucket{span.offset, span.numel, {}, span.expert};
    for (size_t i = span.first; i < span.first + span.count; ++i) {
      bucket.params.push_back(params_[i]);
      bucket_of_.push_back(buckets_.size());
    }
    buckets_.push_back(std::move(bucket));
  }
  weights_ = Tensor::zeros({layout.total}, DType::F32, MemCategory::Params, "param_buffer");
  grads_ = Tensor::zeros({layout.total}, DType::F32, MemCategory::Grads, "grad_buffer");
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    Tensor w = weights_.window(offsets_[i], p.value.shape(), p.name);
    w.copy_from(p.value);
    p.value = w;
    p.grad = grads_.window(offsets_[i], p.value.shape(), p.name + ".grad");
    p.grad_hook = [this, i](Parameter&) { report_index(i); };
  }
}

ParamAndGradBuffer::~ParamAndGradBuffer() {
  for (Parameter* p : params_) p->grad_hook = nullptr;
}

int64_t ParamAndGradBuffer::offset_of(const Parameter& p) const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i] == &p) return offsets_[i];
  fail("parameter '", p.name, "' is not in this gradient buffer");
}

int64_t ParamAndGradBuffer::shards_of(size_t bucket) const {
  return buckets_.at(bucket).expert ? expert_shards_ : shards_;
}

ElementRange ParamAndGradBuffer::shard_range(size_t bucket, int64_t shard) const {
  const int64_t shards = shards_of(bucket);
  MEGATON_CHECK(shard >= 0 && shard < shards, "shard ", shard, " of gradient bucket ", bucket, " with ", shards,
                " shards");
  const GradBucket& b = buckets_[bucket];
  const int64_t n = b.numel / shards;
  return {b.offset + shard * n, n};
}

std::vector<ElementRange> ParamAndGradBuffer::shard_ranges(int64_t shard, int64_t expert_shard) const {
  std::vector<ElementRange> out;
  for (size_t b = 0; b < buckets_.size(); ++b)
    out.push_back(shard_range(b, buckets_[b].expert && expert_shard >= 0 ? expert_shard : shard));
  return out;
}

void ParamAndGradBuffer::begin_step(int64_t microbatches, bool track) {
  MEGATON_CHECK(microbatches > 0, "a step needs at least one micro-batch, got ", microbatches);
  grads_.zero_();
  armed_ = false;
  if (!track) return;
  microbatches_ = microbatches;
  reports_left_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) reports_left_[i] = params_[i]->uses * microbatches;
  params_left_.assign(buckets_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) params_left_[b] = static_cast<int64_t>(buckets_[b].params.size());
  armed_ = true;
}

void ParamAndGradBuffer::report_index(size_t i) {
  if (!armed_) return;  // backward outside a training step (evaluation of gradients, tests)
  if (reports_left_[i] == 0)
    fail("gradient of '", params_[i]->name, "' accumulated again after it was final (uses ", params_[i]->uses,
         " per micro-batch)");
  if (--reports_left_[i] > 0) return;
  const size_t b = bucket_of_[i];
  if (--params_left_[b] > 0) return;
  if (ready_callback_) ready_callback_(b);
}

void ParamAndGradBuffer::end_step() {
  if (!armed_) return;
  armed_ = false;
  for (size_t i = 0; i < params_.size(); ++i)
    if (reports_left_[i] != 0)
      fail("gradient of '", params_[i]->name, "' is missing ", reports_left_[i], " of its ",
           params_[i]->uses * microbatches_, " accumulations at the end of the step (", params_[i]->uses,
           " per micro-batch), so bucket ", bucket_of_[i], " never became ready");
}

std::vector<ElementRange> intersect(const std::vector<ElementRange>& a, const std::vector<ElementRange>& b) {
  std::vector<ElementRange> out;
  for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    const int64_t lo = std::max(a[i].offset, b[j].offset), hi = std::min(a[i].end(), b[j].end());
    if (lo < hi) out.push_back({lo, hi - lo});
    (a[i].end() < b[j].end() ? i : j)++;
  }
  return out;
}

}  // namespace megaton::nn
