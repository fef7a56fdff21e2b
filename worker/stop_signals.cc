#include "worker/stop_signals.h"

#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <thread>

namespace ftd::worker {
namespace {

std::atomic<const char*> g_stage{"starting"};
std::atomic<bool> g_reported{false};

void WriteAll(int fd, const char* s, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, s, n);
    if (w < 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}
void WriteStr(int fd, const char* s) { WriteAll(fd, s, std::strlen(s)); }

void OnExit() {
  if (g_reported.load()) return;
  WriteStr(2, "ftd-worker: exit() called while ");
  WriteStr(2, g_stage.load());
  WriteStr(2, ", before a result was reported; the caller's stack:\n");
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, n, 2);
}

}  // namespace

void StartStopSignalThread(std::atomic<bool>* stop, std::atomic<bool>* skip_checkpoint) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set, stop, skip_checkpoint] {
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      if (sig == SIGUSR1) skip_checkpoint->store(true);  // before stop: the loop reads stop first
      stop->store(true);
      const char* what = sig == SIGUSR1 ? "SIGUSR1: stopping at the next step without a checkpoint"
                         : sig == SIGINT ? "SIGINT: stopping at the next step"
                                         : "SIGTERM: stopping at the next step";
      WriteStr(2, "ftd-worker: received ");
      WriteStr(2, what);
      WriteStr(2, " (while ");
      WriteStr(2, g_stage.load());
      WriteStr(2, ")\n");
    }
  }).detach();
}

void SetStage(const char* stage) { g_stage.store(stage); }

void InstallExitWatch() {
  void* frames[1];
  ::backtrace(frames, 1);  // loads libgcc's unwinder now, not inside the exit hook
  std::atexit(OnExit);
}

void MarkResultReported() { g_reported.store(true); }

}  // namespace ftd::worker
