#include "megaton/data/sigbus_guard.h"

#include <setjmp.h>
#include <signal.h>

#include <mutex>

namespace megaton::data::detail {

namespace {

// The jump target of the catch_sigbus call running on this thread (SIGBUS from a memory access is
// delivered to the thread that faulted), and the address it faulted at.
thread_local sigjmp_buf* t_target = nullptr;
thread_local const void* t_fault = nullptr;
struct sigaction g_previous {};

void on_sigbus(int sig, siginfo_t* info, void* context) {
  if (sigjmp_buf* target = t_target) {
    t_fault = info->si_addr;
    siglongjmp(*target, 1);
  }
  // Not raised inside catch_sigbus: hand it to the previous disposition. Returning re-executes the
  // faulting access, which faults again and is then handled that way (by default, killing us).
  if ((g_previous.sa_flags & SA_SIGINFO) && g_previous.sa_sigaction) {
    g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  } else {
    sigaction(SIGBUS, &g_previous, nullptr);
  }
}

void install_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sigemptyset(&sa.sa_mask);
  // SA_NODEFER: SIGBUS stays unblocked when the handler jumps out, as sigsetjmp(env, 0) saves no mask.
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigaction(SIGBUS, &sa, &g_previous);
}

}  // namespace

const void* run_catching_sigbus(void (*read)(void*), void* arg) {
  static std::once_flag installed;
  std::call_once(installed, install_handler);
  sigjmp_buf target;
  sigjmp_buf* const outer = t_target;  // catch_sigbus calls may nest
  if (sigsetjmp(target, 0) != 0) {
    t_target = outer;
    return t_fault;
  }
  t_target = &target;
  read(arg);
  t_target = outer;
  return nullptr;
}

}  // namespace megaton::data::detail
