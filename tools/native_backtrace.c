/* Native backtraces for `make gpu-test` (tools/gpu_test.sh preloads this into the steps that run
 * Python): on SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGABRT it prints the signal, the faulting
 * address, the library and offset of the faulting instruction and the native call stack to
 * stderr, then exits with 128 + the signal. Python's faulthandler (on under pytest) prints the
 * Python stack first and then re-raises into this handler. A lease lasts minutes and its
 * machine has no debugger: one crash must say where it was. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

static void on_fatal_signal(int sig, siginfo_t* info, void* context) {
  void* pc = NULL;
#if defined(__x86_64__)
  pc = (void*)((ucontext_t*)context)->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
  pc = (void*)((ucontext_t*)context)->uc_mcontext.pc;
#endif
  fprintf(stderr, "native_backtrace: signal %d (%s), address %p, pc %p\n", sig, strsignal(sig),
          info->si_addr, pc);
  Dl_info where;
  if (info->si_code <= 0) /* sent by raise() or kill(), e.g. faulthandler re-raising a fault */
    fprintf(stderr,
            "native_backtrace: the signal was re-raised; the fault is the frame below the "
            "second signal frame (libc's __restore_rt) in the stack below\n");
  else if (pc != NULL && dladdr(pc, &where) && where.dli_fname != NULL)
    fprintf(stderr, "native_backtrace: pc in %s at offset 0x%lx (%s)\n", where.dli_fname,
            (unsigned long)((char*)pc - (char*)where.dli_fbase),
            where.dli_sname != NULL ? where.dli_sname : "no exported symbol");
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  _exit(128 + sig);
}

__attribute__((constructor)) static void install(void) {
  struct sigaction action = {0};
  action.sa_sigaction = on_fatal_signal;
  action.sa_flags = SA_SIGINFO;
  const int signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  for (unsigned i = 0; i < sizeof signals / sizeof signals[0]; ++i)
    sigaction(signals[i], &action, NULL);
}
