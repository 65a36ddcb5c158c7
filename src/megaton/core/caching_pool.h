// A caching pool in front of a slow memory source (cudaMalloc / cudaFree): freed blocks are kept and
// handed out again for requests of the same size class, so a training step that allocates the same
// activation sizes every step stops calling the driver after the first (PyTorch's CUDA caching
// allocator does this; cudaMalloc / cudaFree also synchronise the device). The host-side
// bookkeeping only, with the source behind an interface: it is unit-tested with a fake source on
// machines without a GPU (tests/core/caching_pool_test.cpp), and core/allocator.cpp puts one in
// front of each CUDA device.
//
// Size classes: requests round up to 512 bytes below 1 MiB and to 2 MiB above, so that sizes that
// differ by a little share blocks. A request takes the smallest cached block of at least its class
// and at most 5/4 of it (bounded waste; a larger block stays for a larger request). When the source
// is out of memory, every cached block goes back to it and the request is tried once more.
//
// Blocks are reused in the order their frees were issued on the host: right while all device work
// runs on one stream (in order), which is how the kernels run today; a block used by work on
// another stream would have to record that stream before reuse (not built).
#pragma once
#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>

namespace megaton {

class MemorySource {
 public:
  virtual ~MemorySource() = default;
  // `bytes` (> 0) of fresh memory, or nullptr when the source has none left.
  virtual void* acquire(size_t bytes) = 0;
  virtual void release(void* p, size_t bytes) = 0;
};

struct PoolStats {
  size_t reserved = 0;  // bytes held from the source: blocks in use plus cached ones
  size_t cached = 0;    // bytes of free blocks kept for reuse
  size_t hits = 0;      // requests served from the cache
  size_t misses = 0;    // requests that went to the source
  size_t flushes = 0;   // times the cache was handed back to the source to retry an allocation
};

class CachingPool {
 public:
  explicit CachingPool(MemorySource& source) : source_(source) {}
  ~CachingPool();  // releases the cached blocks (blocks still in use belong to their owners)
  CachingPool(const CachingPool&) = delete;
  CachingPool& operator=(const CachingPool&) = delete;

  static size_t size_class(size_t bytes);
  // A block of at least `bytes` (nullptr for 0), or nullptr when the source is out of memory even
  // with the cache emptied.
  void* allocate(size_t bytes);
  // Returns a block from allocate() to the cache; throws std::logic_error for any other pointer.
  void free(void* p);
  // Hands every cached block back to the source.
  void empty_cache();
  PoolStats stats() const;

 private:
  void release_cached_locked();
  MemorySource& source_;
  mutable std::mutex mutex_;
  std::multimap<size_t, void*> cached_;            // free blocks by size
  std::unordered_map<void*, size_t> in_use_;       // block -> its size
  PoolStats stats_;
};

}  // namespace megaton
