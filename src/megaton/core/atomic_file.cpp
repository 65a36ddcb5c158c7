#include "megaton/core/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "megaton/core/error.h"

namespace megaton {

namespace {
// Large stdio buffer: datasets are written as many small token runs.
constexpr size_t kBufferBytes = 1 << 20;

void fsync_directory_of(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // durability of the rename is best effort; the data itself is already synced
  ::fsync(fd);
  ::close(fd);
}
}  // namespace

// The temporary is named for this process, so processes writing the same file at once (the ranks
// of a distributed run caching the same sample index) each write their own and the last rename wins
// with a complete file.
AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), tmp_(path_ + "." + std::to_string(::getpid()) + ".tmp") {
  file_ = std::fopen(tmp_.c_str(), "wb");
  if (!file_) fail("cannot create ", tmp_, " (writing ", path_, "): ", std::strerror(errno));
  std::setvbuf(file_, nullptr, _IOFBF, kBufferBytes);
}

AtomicFile::~AtomicFile() {
  if (committed_) return;
  if (file_) std::fclose(file_);
  std::remove(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  if (committed_) fail("write to ", path_, " after it was committed");
  if (bytes && std::fwrite(data, 1, bytes, file_) != bytes)
    fail("cannot write ", bytes, " bytes to ", tmp_, " (writing ", path_, "): ", std::strerror(errno));
  written_ += bytes;
}

void AtomicFile::commit() {
  if (committed_) fail(path_, " committed twice");
  if (std::fflush(file_) != 0 || ::fsync(fileno(file_)) != 0)
    fail("cannot flush ", tmp_, " (writing ", path_, "): ", std::strerror(errno));
  int rc = std::fclose(file_);
  file_ = nullptr;
  if (rc != 0) fail("cannot close ", tmp_, " (writing ", path_, "): ", std::strerror(errno));
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
    fail("cannot rename ", tmp_, " to ", path_, ": ", std::strerror(errno));
  committed_ = true;
  fsync_directory_of(path_);
}

void write_file_atomically(const std::string& path, std::string_view text) {
  AtomicFile out(path);
  out.write(text.data(), text.size());
  out.commit();
}

std::vector<std::string> remove_abandoned_temporaries(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || !name.ends_with(".tmp")) continue;
    const std::string stem = name.substr(0, name.size() - 4);
    const size_t dot = stem.rfind('.');
    if (dot == std::string::npos || dot + 1 == stem.size() || stem.size() - dot > 11) continue;
    if (stem.find_first_not_of("0123456789", dot + 1) != std::string::npos) continue;
    const long pid = std::stol(stem.substr(dot + 1));
    // kill(pid, 0) probes without signalling: ESRCH means no such process. A pid the kernel
    // cannot hold (above pid_t's range) belongs to no process either.
    if (pid <= 0 || (pid <= INT32_MAX && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH))) continue;
    removed.push_back(e.path().string());
  }
  for (const std::string& p : removed) fs::remove(p, ec);
  return removed;
}

}  // namespace megaton
