#include "megaton/data/mapped_file.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "megaton/core/error.h"
#include "megaton/core/regular_file.h"

namespace megaton::data {

MappedFile::MappedFile(std::string path, std::string_view what) : path_(std::move(path)), what_(what) {
  const FileDescriptor fd = open_regular_file(path_, what);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail("cannot stat ", what, " ", path_, ": ", std::strerror(errno));
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) fail("cannot map ", what, " ", path_, " (", size_, " bytes): ", std::strerror(errno));
    data_ = static_cast<const uint8_t*>(p);
  }
}

void MappedFile::fail_changed() const {
  struct stat st {};
  const std::string now = ::stat(path_.c_str(), &st) == 0 ? std::to_string(st.st_size) + " bytes" : "gone";
  fail(what_, " ", path_, " changed while in use: it was ", size_, " bytes when opened and is now ", now,
       " (truncated or rewritten by another process?)");
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      what_(std::move(other.what_)),
      data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    path_ = std::move(other.path_);
    what_ = std::move(other.what_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace megaton::data
