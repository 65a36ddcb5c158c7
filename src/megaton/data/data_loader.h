// Micro-batches of int32 inputs / targets read ahead on background threads, in the order of Megatron's
// MegatronPretrainingSampler: the sample stream is cut into consecutive global micro-steps of
// micro_batch_size x data_parallel_size samples, and data-parallel rank r takes samples
// [r * micro_batch_size, (r + 1) * micro_batch_size) of each. The order is a pure function of the
// consumed-samples count, so a run resumed from a checkpoint's count continues exactly where it stopped.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "megaton/data/sample_source.h"

namespace megaton::data {

struct Batch {
  int64_t micro_batch_size = 0, seq_length = 0;
  std::vector<int64_t> sample_ids;       // this rank's samples, positions in the source
  std::vector<int32_t> inputs, targets;  // [micro_batch_size, seq_length] row-major; targets shifted by one
};

struct DataLoaderOptions {
  int64_t micro_batch_size = 1;
  int64_t data_parallel_rank = 0;
  int64_t data_parallel_size = 1;
  int64_t consumed_samples = 0;  // global samples consumed before this loader starts (resume point)
  int num_workers = 2;           // background threads reading samples
  int prefetch = 8;              // micro-batches read ahead of the consumer
};

class DataLoader {
 public:
  static constexpr int kMaxWorkers = 256, kMaxPrefetch = 4096;
  // Errors name the offending option; consumed_samples beyond the source is an error too.
  DataLoader(std::shared_ptr<const SampleSource> source, DataLoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // This rank's next micro-batch; false once the source has no complete global micro-step left (the
  // partial one is dropped, as Megatron does). A read error on a worker is rethrown here, in order.
  bool next(Batch& batch);
  // Global samples consumed by the micro-steps returned so far: the number a checkpoint stores.
  int64_t consumed_samples() const;
  // Global micro-steps left to return.
  int64_t remaining() const;

 private:
  struct Slot {
    bool ready = false;
    Batch batch;
    std::exception_ptr error;
  };

  void work();
  void fill(int64_t step, Batch& batch) const;
  void stop_workers();  // asks the workers to stop and joins them

  std::shared_ptr<const SampleSource> source_;
  DataLoaderOptions opt_;
  int64_t steps_;  // global micro-steps available from the resume point on
  mutable std::mutex mu_;
  std::condition_variable ready_cv_, space_cv_;
  std::vector<Slot> slots_;  // micro-step k lives in slots_[k % prefetch]
  int64_t next_ = 0;         // next micro-step to return
  int64_t claimed_ = 0;      // next micro-step for a worker to read
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace megaton::data
