#include "megaton/core/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "megaton/core/error.h"

namespace megaton {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0) ::close(fd_);
}

FileDescriptor open_regular_file(const std::string& path, std::string_view what) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) fail("cannot open ", what, " ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail("cannot stat ", what, " ", path, ": ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(what, " ", path, " is ", kind_of(st.st_mode), ", not a regular file");
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0)
    fail("cannot set blocking reads on ", what, " ", path, ": ", std::strerror(errno));
  return fd;
}

std::FILE* fopen_regular_file(const std::string& path, std::string_view what) {
  FileDescriptor fd = open_regular_file(path, what);
  std::FILE* f = ::fdopen(fd.get(), "rb");
  if (!f) fail("cannot open ", what, " ", path, ": ", std::strerror(errno));
  fd.release();
  return f;
}

std::string read_regular_file(const std::string& path, std::string_view what) {
  const FileDescriptor fd = open_regular_file(path, what);
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n == 0) return text;
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot read ", what, " ", path, ": ", std::strerror(errno));
    }
    text.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace megaton
