// Ctrl-C and SIGTERM in ftctl (context.h): blocked in every thread from the start of main, taken by
// one thread of their own that interrupts the call in flight and records that it happened.
#include <pthread.h>
#include <signal.h>

#include <atomic>

#include "client/context.h"

namespace ftd::client {

namespace {

std::atomic<bool> g_interrupted{false};

const sigset_t& InterruptSet() {
  static const sigset_t s = [] {
    sigset_t x;
    sigemptyset(&x);
    sigaddset(&x, SIGINT);
    sigaddset(&x, SIGTERM);
    sigaddset(&x, SIGUSR2);
    return x;
  }();
  return s;
}

}  // namespace

void BlockInterruptSignals() { pthread_sigmask(SIG_BLOCK, &InterruptSet(), nullptr); }

bool Interrupted() { return g_interrupted; }

InterruptHandler::InterruptHandler(JobClient* client) : client_(client) {
  thread_ = std::thread([this] {
    int sig = 0;
    sigwait(&InterruptSet(), &sig);
    if (sig == SIGUSR2) return;  // our own wake-up at exit
    g_interrupted = true;
    client_->Interrupt();
  });
}

InterruptHandler::~InterruptHandler() {
  pthread_kill(thread_.native_handle(), SIGUSR2);
  thread_.join();
}

}  // namespace ftd::client
