#include "megaton/core/caching_pool.h"

#include <stdexcept>

namespace megaton {

namespace {
constexpr size_t kSmall = size_t{1} << 20, kSmallRound = 512, kLargeRound = size_t{2} << 20;
}  // namespace

size_t CachingPool::size_class(size_t bytes) {
  const size_t round = bytes <= kSmall ? kSmallRound : kLargeRound;
  if (bytes > SIZE_MAX - round) return 0;  // no class: allocate() refuses it
  return (bytes + round - 1) / round * round;
}

CachingPool::~CachingPool() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
}

void* CachingPool::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t size = size_class(bytes);
  if (size == 0) return nullptr;
  std::lock_guard lock(mutex_);
  auto it = cached_.lower_bound(size);
  if (it != cached_.end() && it->first <= size + size / 4) {
    void* p = it->second;
    in_use_.emplace(p, it->first);
    stats_.cached -= it->first;
    cached_.erase(it);
    ++stats_.hits;
    return p;
  }
  void* p = source_.acquire(size);
  if (!p && !cached_.empty()) {  // out of memory with blocks idle in the cache: give them back, retry
    release_cached_locked();
    ++stats_.flushes;
    p = source_.acquire(size);
  }
  if (!p) return nullptr;
  in_use_.emplace(p, size);
  stats_.reserved += size;
  ++stats_.misses;
  return p;
}

void CachingPool::free(void* p) {
  if (!p) return;
  std::lock_guard lock(mutex_);
  const auto it = in_use_.find(p);
  if (it == in_use_.end()) throw std::logic_error("CachingPool::free: a pointer this pool did not hand out");
  cached_.emplace(it->second, p);
  stats_.cached += it->second;
  in_use_.erase(it);
}

void CachingPool::empty_cache() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
}

PoolStats CachingPool::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CachingPool::release_cached_locked() {
  for (const auto& [size, p] : cached_) {
    source_.release(p, size);
    stats_.reserved -= size;
  }
  cached_.clear();
  stats_.cached = 0;
}

}  // namespace megaton
