#include "megaton/core/mapped_file.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "megaton/core/error.h"

namespace megaton {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
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
  return std::shared_ptr<MappedFile>(new MappedFile(static_cast<char*>(p), size));
}

MappedFile::~MappedFile() { munmap(data_, size_); }

}  // namespace megaton
