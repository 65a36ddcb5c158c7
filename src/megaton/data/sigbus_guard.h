// Reading memory-mapped files that may shrink underneath: when another process truncates a file
// while it is mapped, touching a page past its new end raises SIGBUS, which would kill the process
// with no word about the file. Reads of mapped datasets run under catch_sigbus instead, which turns
// that signal into a return value the caller reports as an error naming the file. Cheap enough for
// the sampling hot path: no system call per read (sigsetjmp without saving the signal mask).
#pragma once
#include <type_traits>

namespace megaton::data {

namespace detail {
const void* run_catching_sigbus(void (*read)(void*), void* arg);
}

// Runs read() and returns nullptr, or, if it raised SIGBUS, the faulting address (the rest of read()
// is skipped). read() must only load from mapped memory into plain objects: it is abandoned midway,
// so it may not throw, allocate or own anything that needs destroying. SIGBUS raised outside such a
// call is left to the disposition that was in place before (the default: the process dies).
template <typename F>
const void* catch_sigbus(F&& read) {
  using Fn = std::remove_reference_t<F>;
  return detail::run_catching_sigbus([](void* f) { (*static_cast<Fn*>(f))(); }, &read);
}

}  // namespace megaton::data
