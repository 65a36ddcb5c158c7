// The caching pool's bookkeeping (core/caching_pool.h) against a fake memory source with a
// capacity: reuse without going back to the source, size classes and the bound on waste, the
// flush-and-retry when the source runs out, stats, and no block ever handed out twice.
#include "megaton/core/caching_pool.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <stdexcept>
#include <vector>

namespace megaton {
namespace {

// Host memory with a byte budget, counting its calls.
class FakeSource final : public MemorySource {
 public:
  explicit FakeSource(size_t capacity) : capacity_(capacity) {}
  ~FakeSource() override { EXPECT_EQ(held_, 0u) << "blocks never released"; }
  void* acquire(size_t bytes) override {
    ++acquires;
    if (held_ + bytes > capacity_) return nullptr;
    held_ += bytes;
    return std::malloc(bytes);
  }
  void release(void* p, size_t bytes) override {
    ++releases;
    held_ -= bytes;
    std::free(p);
  }
  size_t held() const { return held_; }
  int acquires = 0, releases = 0;

 private:
  size_t capacity_, held_ = 0;
};

TEST(CachingPool, SizeClassesRoundTo512BytesThenTo2MiB) {
  EXPECT_EQ(CachingPool::size_class(1), 512u);
  EXPECT_EQ(CachingPool::size_class(512), 512u);
  EXPECT_EQ(CachingPool::size_class(513), 1024u);
  EXPECT_EQ(CachingPool::size_class(size_t{1} << 20), size_t{1} << 20);
  EXPECT_EQ(CachingPool::size_class((size_t{1} << 20) + 1), size_t{2} << 20);
  EXPECT_EQ(CachingPool::size_class((size_t{5} << 20) + 7), size_t{6} << 20);
  EXPECT_EQ(CachingPool::size_class(SIZE_MAX - 10), 0u);  // no class: allocate() refuses it
}

TEST(CachingPool, AStepThatAllocatesTheSameSizesAgainReusesItsBlocks) {
  FakeSource source(size_t{1} << 30);
  {
    CachingPool pool(source);
    const std::vector<size_t> sizes = {100, 4096, 3 << 20, 3 << 20, 700};
    for (int step = 0; step < 3; ++step) {
      std::vector<void*> blocks;
      for (size_t s : sizes) blocks.push_back(pool.allocate(s));
      EXPECT_EQ(std::set<void*>(blocks.begin(), blocks.end()).size(), sizes.size()) << "a block handed out twice";
      for (void* p : blocks) pool.free(p);
    }
    EXPECT_EQ(source.acquires, 5) << "only the first step goes to the source";
    const PoolStats s = pool.stats();
    EXPECT_EQ(s.misses, 5u);
    EXPECT_EQ(s.hits, 10u);
    EXPECT_EQ(s.reserved, 512u + 4096 + 2 * (4u << 20) + 1024);
    EXPECT_EQ(s.cached, s.reserved);
    EXPECT_EQ(source.held(), s.reserved);
  }
  EXPECT_EQ(source.releases, 5) << "the destructor hands the cache back";
}

TEST(CachingPool, ALargerCachedBlockServesOnlyRequestsWithinAQuarterOfIt) {
  FakeSource source(size_t{1} << 30);
  CachingPool pool(source);
  void* big = pool.allocate(size_t{10} << 20);
  pool.free(big);
  void* small = pool.allocate(size_t{3} << 20);  // 10 MiB for 4 MiB would waste 60%: a new block
  EXPECT_NE(small, big);
  void* close = pool.allocate(size_t{9} << 20);  // class 10 MiB: the cached one
  EXPECT_EQ(close, big);
  EXPECT_EQ(source.acquires, 2);
  pool.free(small);
  pool.free(close);
}

TEST(CachingPool, RunningOutHandsTheCacheBackAndRetriesOnce) {
  FakeSource source(size_t{8} << 20);
  CachingPool pool(source);
  void* a = pool.allocate(size_t{4} << 20);
  void* b = pool.allocate(size_t{2} << 20);
  pool.free(a);  // 4 MiB cached, 2 MiB in use, 2 MiB left in the source
  void* c = pool.allocate(size_t{6} << 20);  // fits only once the cached 4 MiB is released
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(pool.stats().flushes, 1u);
  EXPECT_EQ(pool.stats().cached, 0u);
  EXPECT_EQ(pool.stats().reserved, size_t{8} << 20);
  EXPECT_EQ(pool.allocate(size_t{1} << 20), nullptr) << "nothing cached, nothing left: out of memory";
  pool.free(b);
  pool.free(c);
  pool.empty_cache();
  EXPECT_EQ(source.held(), 0u);
  EXPECT_EQ(pool.stats().reserved, 0u);
}

TEST(CachingPool, RefusesPointersItDidNotHandOutAndTakesZeroBytes) {
  FakeSource source(1 << 20);
  CachingPool pool(source);
  EXPECT_EQ(pool.allocate(0), nullptr);
  pool.free(nullptr);
  int x = 0;
  EXPECT_THROW(pool.free(&x), std::logic_error);
  void* p = pool.allocate(64);
  pool.free(p);
  EXPECT_THROW(pool.free(p), std::logic_error) << "a double free";
  EXPECT_EQ(pool.allocate(SIZE_MAX - 10), nullptr);
}

}  // namespace
}  // namespace megaton
