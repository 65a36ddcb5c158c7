#include "megaton/data/data_loader.h"

#include <algorithm>

#include "megaton/core/checked.h"
#include "megaton/core/error.h"

namespace megaton::data {

DataLoader::DataLoader(std::shared_ptr<const SampleSource> source, DataLoaderOptions options)
    : source_(std::move(source)), opt_(options) {
  if (!source_) fail("data loader: no dataset");
  if (opt_.micro_batch_size < 1) fail("data loader: micro_batch_size must be positive, got ", opt_.micro_batch_size);
  if (opt_.data_parallel_size < 1 || opt_.data_parallel_rank < 0 || opt_.data_parallel_rank >= opt_.data_parallel_size)
    fail("data loader: data-parallel rank ", opt_.data_parallel_rank, " is not in [0, ", opt_.data_parallel_size, ")");
  if (opt_.num_workers < 1 || opt_.num_workers > kMaxWorkers || opt_.prefetch < 1 || opt_.prefetch > kMaxPrefetch)
    fail("data loader: num_workers (", opt_.num_workers, ") must be in [1, ", kMaxWorkers, "] and prefetch (",
         opt_.prefetch, ") in [1, ", kMaxPrefetch, "]");
  if (opt_.consumed_samples < 0 || opt_.consumed_samples > source_->size())
    fail("data loader: consumed_samples ", opt_.consumed_samples, " is outside the dataset's ", source_->size(),
         " samples");
  steps_ = (source_->size() - opt_.consumed_samples) /
           checked_mul("data loader: micro_batch_size x data_parallel_size", opt_.micro_batch_size,
                       opt_.data_parallel_size);
  slots_.resize(static_cast<size_t>(opt_.prefetch));
  try {
    for (int w = 0; w < opt_.num_workers; ++w) workers_.emplace_back([this] { work(); });
  } catch (const std::system_error& e) {
    // The threads that did start must be stopped and joined before this constructor unwinds
    // (a joinable std::thread destroyed would terminate the process).
    const size_t started = workers_.size();
    stop_workers();
    fail("data loader: cannot start worker thread ", started + 1, " of ", opt_.num_workers, ": ", e.what());
  }
}

DataLoader::~DataLoader() { stop_workers(); }

void DataLoader::stop_workers() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  space_cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

void DataLoader::fill(int64_t step, Batch& batch) const {
  const int64_t B = opt_.micro_batch_size, T = source_->seq_length();
  batch.micro_batch_size = B;
  batch.seq_length = T;
  batch.sample_ids.resize(static_cast<size_t>(B));
  batch.inputs.resize(static_cast<size_t>(B * T));
  batch.targets.resize(static_cast<size_t>(B * T));
  const int64_t first = opt_.consumed_samples + step * B * opt_.data_parallel_size + opt_.data_parallel_rank * B;
  for (int64_t b = 0; b < B; ++b) batch.sample_ids[static_cast<size_t>(b)] = first + b;
  read_batch(*source_, first, B, batch.inputs.data(), batch.targets.data());
}

void DataLoader::work() {
  std::unique_lock lock(mu_);
  for (;;) {
    space_cv_.wait(lock, [&] { return stop_ || claimed_ >= steps_ || claimed_ < next_ + opt_.prefetch; });
    if (stop_ || claimed_ >= steps_) return;
    const int64_t step = claimed_++;
    Slot& slot = slots_[static_cast<size_t>(step % opt_.prefetch)];
    // The slot is free: its previous micro-step was consumed, or the window check above would have waited.
    Batch batch = std::move(slot.batch);
    std::exception_ptr error;
    lock.unlock();
    try {
      fill(step, batch);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    slot.batch = std::move(batch);
    slot.error = error;
    slot.ready = true;
    ready_cv_.notify_all();
  }
}

bool DataLoader::next(Batch& batch) {
  std::unique_lock lock(mu_);
  if (next_ >= steps_) return false;
  Slot& slot = slots_[static_cast<size_t>(next_ % opt_.prefetch)];
  ready_cv_.wait(lock, [&] { return slot.ready; });
  if (slot.error) std::rethrow_exception(slot.error);  // the loader stays at this micro-step
  std::swap(batch, slot.batch);                        // the caller's old buffers are reused for a later micro-step
  slot.ready = false;
  ++next_;
  space_cv_.notify_all();
  return true;
}

int64_t DataLoader::consumed_samples() const {
  std::lock_guard lock(mu_);
  return opt_.consumed_samples + next_ * opt_.micro_batch_size * opt_.data_parallel_size;
}

int64_t DataLoader::remaining() const {
  std::lock_guard lock(mu_);
  return steps_ - next_;
}

}  // namespace megaton::data
