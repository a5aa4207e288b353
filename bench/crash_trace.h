// A bench that dies of a signal prints where (stderr), so a crash on a lent GPU machine, which has
// no debugger and goes back after the run, can be read from the log it leaves
// (scripts/device/check.sh demangles it): the faulting address, the stack the unwinder finds, and
// the code addresses among the words on top of the stack (when the crash jumped to a bad address,
// the unwinder stops at once, and the word on top of the stack is where the bad call came from).
// Bench programs only: the library never installs signal handlers in its host process.
#pragma once

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdint>
#include <initializer_list>

namespace volt::bench {

namespace detail {

inline void say(const char* text) {
  size_t n = 0;
  while (text[n] != '\0') ++n;
  [[maybe_unused]] const ssize_t ignored = write(STDERR_FILENO, text, n);
}

inline void say_hex(const char* label, uintptr_t value) {
  char text[40] = {};
  int at = 0;
  for (const char* c = label; *c != '\0' && at < 16; ++c) text[at++] = *c;
  text[at++] = '0';
  text[at++] = 'x';
  for (int shift = 60; shift >= 0; shift -= 4) text[at++] = "0123456789abcdef"[(value >> shift) & 0xf];
  text[at++] = '\n';
  [[maybe_unused]] const ssize_t ignored = write(STDERR_FILENO, text, static_cast<size_t>(at));
}

inline void print_crash_and_die(int signal_number, siginfo_t* info, void* context) {
  // write, backtrace (its first call, which may allocate, is made by print_stack_on_crash) and
  // backtrace_symbols_fd; dladdr only filters the stack words (not async-signal-safe, but the
  // process is dying anyway).
  say("\nvolt-bench: died of a signal; the stack of the thread that died:\n");
  say_hex("fault address ", reinterpret_cast<uintptr_t>(info->si_addr));
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
#if defined(__x86_64__)
  const auto* registers = static_cast<ucontext_t*>(context)->uc_mcontext.gregs;
  void* pc = reinterpret_cast<void*>(registers[REG_RIP]);
  say_hex("pc ", reinterpret_cast<uintptr_t>(pc));
  backtrace_symbols_fd(&pc, 1, STDERR_FILENO);
  say("code addresses among the 256 words on top of the stack:\n");
  auto* const* words = reinterpret_cast<void* const*>(registers[REG_RSP]);
  for (int i = 0; i < 256; ++i) {
    Dl_info where{};
    void* word = words[i];
    if (dladdr(word, &where) != 0 && where.dli_sname != nullptr) backtrace_symbols_fd(&word, 1, STDERR_FILENO);
  }
#endif
  raise(signal_number);  // SA_RESETHAND restored the default: the process dies of the same signal
}

}  // namespace detail

/// Installs the handler for SIGSEGV, SIGBUS, SIGFPE and SIGILL (once, at the start of main).
inline void print_stack_on_crash() {
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  struct sigaction action {};
  action.sa_sigaction = detail::print_crash_and_die;
  action.sa_flags = SA_RESETHAND | SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  for (const int signal_number : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) sigaction(signal_number, &action, nullptr);
}

}  // namespace volt::bench
