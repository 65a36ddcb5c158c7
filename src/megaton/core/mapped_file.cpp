#include "megaton/core/mapped_file.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "megaton/core/error.h"

namespace megaton {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;

// A mapped file that shrinks under the process (truncated or rewritten in place) turns reads of its
// pages past the new end into SIGBUS, which would kill a server with a bare "Bus error". The live
// mappings are kept in fixed slots that a SIGBUS handler can read without locking or allocating; a
// fault inside one of them ends the process with a message naming the file, any other goes to the
// handler that was there before (or the default action).
struct MappedRange {
  std::atomic<uintptr_t> begin{0}, end{0};
  char path[256] = {};
};
constexpr size_t kRanges = 64;  // beyond that, a mapping gets no message (it still works)
MappedRange g_ranges[kRanges];
struct sigaction g_previous_sigbus {};

void write_all(const char* text) {
  for (size_t n = std::strlen(text); n > 0;) {
    const ssize_t w = write(STDERR_FILENO, text, n);
    if (w <= 0) return;
    text += w;
    n -= static_cast<size_t>(w);
  }
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const auto at = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const MappedRange& r : g_ranges) {
    if (at >= r.begin.load(std::memory_order_acquire) && at < r.end.load(std::memory_order_acquire)) {
      write_all("megaton: error: the memory-mapped file '");
      write_all(r.path);
      write_all(
          "' shrank while in use (truncated or rewritten in place?); its pages past the new end cannot be "
          "read. Replace a model's files by writing new ones and renaming them over the old.\n");
      _exit(1);
    }
  }
  if (g_previous_sigbus.sa_flags & SA_SIGINFO) return g_previous_sigbus.sa_sigaction(sig, info, context);
  if (g_previous_sigbus.sa_handler != SIG_DFL && g_previous_sigbus.sa_handler != SIG_IGN)
    return g_previous_sigbus.sa_handler(sig);
  signal(SIGBUS, SIG_DFL);  // returning re-runs the faulting access, which now ends the process
}

// A slot for [data, data + size) once the handler is installed; -1 when every slot is taken.
int register_range(const char* data, size_t size, const std::string& path) {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &g_previous_sigbus);
  });
  static std::mutex mu;
  const std::lock_guard<std::mutex> lock(mu);
  for (size_t i = 0; i < kRanges; ++i) {
    MappedRange& r = g_ranges[i];
    if (r.end.load(std::memory_order_relaxed) != 0) continue;
    std::snprintf(r.path, sizeof r.path, "%s", path.c_str());
    r.begin.store(reinterpret_cast<uintptr_t>(data), std::memory_order_relaxed);
    r.end.store(reinterpret_cast<uintptr_t>(data) + size, std::memory_order_release);
    return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

std::shared_ptr<MappedFile> MappedFile::of_descriptor(int fd, const std::string& path, std::string_view what) {
  struct stat st {};
  if (fstat(fd, &st) != 0) fail("cannot stat ", what, " '", path, "': ", std::strerror(errno));
  if (st.st_size <= 0) fail(what, " '", path, "' is empty");
  const auto size = static_cast<size_t>(st.st_size);
  if (size > SIZE_MAX - 2 * kHugePage) fail(what, " '", path, "' is too large to map (", size, " bytes)");
  // At a 2 MiB-aligned address, so that the kernel can map the page cache's 2 MiB folios with one
  // page-table entry each: with 4 KiB entries a batch-1 decode streaming the weights measured ~20%
  // slower, the TLB walking every 4 KiB (docs/performance.md). Reserve room, then map the file over
  // the aligned part of it and give back the rest.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t mapped = (size + page - 1) / page * page, reserved = mapped + kHugePage;
  void* r = mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) fail("cannot reserve ", reserved, " bytes of address space to map ", what, " '", path, "'");
  const auto start = reinterpret_cast<uintptr_t>(r);
  const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  void* p = mmap(reinterpret_cast<void*>(aligned), size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    munmap(r, reserved);
    fail("cannot map ", what, " '", path, "' (", size, " bytes) into memory: ", std::strerror(err));
  }
  if (aligned > start) munmap(r, aligned - start);
  if (start + reserved > aligned + mapped)
    munmap(reinterpret_cast<void*>(aligned + mapped), start + reserved - aligned - mapped);
  // Hints (failure changes nothing): read ahead in 2 MiB folios, and start reading now.
  madvise(p, size, MADV_HUGEPAGE);
  madvise(p, size, MADV_WILLNEED);
  const int slot = register_range(static_cast<char*>(p), size, path);
  return std::shared_ptr<MappedFile>(new MappedFile(static_cast<char*>(p), size, slot));
}

MappedFile::~MappedFile() {
  if (slot_ >= 0) {
    MappedRange& r = g_ranges[slot_];
    r.end.store(0, std::memory_order_release);  // empty before the pages go, free for reuse after
    r.begin.store(0, std::memory_order_relaxed);
  }
  munmap(data_, size_);
}

}  // namespace megaton
