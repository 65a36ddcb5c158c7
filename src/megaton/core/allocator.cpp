#include "megaton/core/allocator.h"

#include <malloc.h>
#include <sys/mman.h>

#include <cstdlib>
#include <mutex>

#include "megaton/core/caching_pool.h"
#include "megaton/core/error.h"
#ifdef MEGATON_WITH_CUDA
#include "megaton/core/cuda/cuda_memory.h"
#endif

namespace megaton {

std::string_view mem_category_name(MemCategory c) {
  static constexpr std::string_view names[] = {"params",      "grads",     "optimizer",
                                               "activations", "workspace", "other"};
  return names[static_cast<size_t>(c)];
}

namespace {

#ifdef MEGATON_WITH_CUDA
// cudaMalloc / cudaFree of one device behind the caching pool.
class CudaMemory final : public MemorySource {
 public:
  explicit CudaMemory(int device) : device_(device) {}
  void* acquire(size_t bytes) override { return cuda::device_try_malloc(device_, bytes); }
  void release(void* p, size_t) override { cuda::device_free(device_, p); }

 private:
  int device_;
};

// The pool is on unless MEGATON_CUDA_CACHING is "0".
bool caching_enabled() {
  const char* v = std::getenv("MEGATON_CUDA_CACHING");
  return !(v && std::string_view(v) == "0");
}
#endif

}  // namespace

Allocator::Allocator(Device device) : device_(device) {
#ifdef MEGATON_WITH_CUDA
  if (device.is_cuda() && caching_enabled()) {
    source_ = std::make_unique<CudaMemory>(device.index);
    pool_ = std::make_unique<CachingPool>(*source_);
  }
#endif
}

Allocator& Allocator::host() {
  static Allocator a = [] {
    // Training allocates the same activation sizes every step. glibc would serve each large
    // block with a fresh mmap and return it on free, so every step would page-fault (and the
    // kernel zero) all activation memory again; keeping freed memory in the heap avoids that.
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    return Allocator(Device::cpu());
  }();
  return a;
}

Allocator& Allocator::of(Device device) {
  if (device.is_cpu()) return host();
  if (device.index < 0 || device.index >= kMaxCudaDevices)
    fail("device ", device.str(), " is out of range: at most ", kMaxCudaDevices, " CUDA devices");
#ifdef MEGATON_WITH_CUDA
  static Allocator* cuda[kMaxCudaDevices] = {};
  static std::once_flag once[kMaxCudaDevices];
  std::call_once(once[device.index], [&] { cuda[device.index] = new Allocator(device); });  // lives for the process
  return *cuda[device.index];
#else
  fail("tensor on ", device.str(), " requested, but this Megaton was built without CUDA (nvcc was not found when "
       "CMake configured the build)");
#endif
}

namespace {
// Blocks of at least this many bytes are aligned to 2 MiB and asked to be backed by transparent huge
// pages (where the kernel leaves THP to madvise): touching a fresh 5 GB of weights is 2.4 thousand
// page faults instead of 1.2 million, which under virtualisation dominated a llama3-1b load.
constexpr size_t kHugePageBlock = size_t{4} << 20, kHugePage = size_t{2} << 20;

void raise_peak(std::atomic<size_t>& peak, size_t value) {
  size_t prev = peak.load(std::memory_order_relaxed);
  while (value > prev && !peak.compare_exchange_weak(prev, value, std::memory_order_relaxed)) {
  }
}
}  // namespace

void* Allocator::allocate(size_t bytes, MemCategory cat, std::string_view what) {
  void* p = nullptr;
  if (device_.is_cpu()) {
    if (bytes > SIZE_MAX - kHugePage)
      fail("cannot allocate ", bytes, " bytes for '", what, "' (", mem_category_name(cat), "): too large");
    const size_t align = bytes >= kHugePageBlock ? kHugePage : 64;
    const size_t rounded = (bytes + align - 1) / align * align;
    p = rounded ? std::aligned_alloc(align, rounded) : nullptr;
    if (p && align == kHugePage) madvise(p, rounded, MADV_HUGEPAGE);  // a hint: failure changes nothing
    if (rounded && !p)
      fail("out of host memory allocating ", bytes, " bytes for '", what, "' (", mem_category_name(cat), ")");
  } else {
#ifdef MEGATON_WITH_CUDA
    p = pool_ ? pool_->allocate(bytes) : cuda::device_try_malloc(device_.index, bytes);
    if (!p && bytes > 0) {
      const PoolStats ps = pool_ ? pool_->stats() : PoolStats{};
      fail("out of memory on ", device_.str(), " allocating ", bytes, " bytes for '", what, "' (",
           mem_category_name(cat), "): ", total_live_.load(), " bytes live in tensors, ", ps.reserved,
           " reserved by the caching pool (its cache already handed back)");
    }
#endif
  }
  auto i = static_cast<size_t>(cat);
  raise_peak(peak_[i], live_[i].fetch_add(bytes, std::memory_order_relaxed) + bytes);
  allocated_[i].fetch_add(bytes, std::memory_order_relaxed);
  raise_peak(total_peak_, total_live_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  return p;
}

void Allocator::deallocate(void* p, size_t bytes, MemCategory cat) {
  if (device_.is_cpu()) {
    std::free(p);
  } else {
#ifdef MEGATON_WITH_CUDA
    if (pool_)
      pool_->free(p);
    else
      cuda::device_free(device_.index, p);
#endif
  }
  live_[static_cast<size_t>(cat)].fetch_sub(bytes, std::memory_order_relaxed);
  total_live_.fetch_sub(bytes, std::memory_order_relaxed);
}

MemStats Allocator::stats() const {
  MemStats s;
  for (size_t i = 0; i < kNumMemCategories; ++i) {
    s.live[i] = live_[i].load();
    s.peak[i] = peak_[i].load();
    s.allocated[i] = allocated_[i].load();
  }
  s.total_live = total_live_.load();
  s.total_peak = total_peak_.load();
  s.reserved = s.total_live;
  if (pool_) {
    const PoolStats ps = pool_->stats();
    s.reserved = ps.reserved;
    s.cached = ps.cached;
  }
  return s;
}

void Allocator::empty_cache() {
  if (pool_) pool_->empty_cache();
  // glibc keeps freed blocks below its (growing) mmap threshold in its arenas: after a quantised
  // model's fp32 weights are freed, 2.6 of llama3-1b's 5.0 GB resident were such free blocks.
  if (device_.is_cpu()) malloc_trim(0);
}

void Allocator::reset_peaks() {
  for (size_t i = 0; i < kNumMemCategories; ++i) {
    peak_[i] = live_[i].load();
    allocated_[i] = 0;
  }
  total_peak_ = total_live_.load();
}

}  // namespace megaton
