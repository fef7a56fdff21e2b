#include "client/follow.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <thread>

#include "client/context.h"
#include "client/render.h"

namespace ftd::client {

namespace {

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

// Ctrl-C during watch/wait stops watching (not the job): a thread takes SIGINT/SIGTERM (blocked in
// every other thread) and interrupts the stream.
class InterruptWatcher {
 public:
  explicit InterruptWatcher(JobClient* c) : client_(c) {
    thread_ = std::thread([this] {
      int sig = 0;
      sigwait(&InterruptSet(), &sig);
      if (sig == SIGUSR2) return;  // our own wake-up at exit
      fired_ = true;
      client_->Interrupt();
    });
  }
  ~InterruptWatcher() {
    pthread_kill(thread_.native_handle(), SIGUSR2);
    thread_.join();
  }
  bool fired() const { return fired_; }

 private:
  JobClient* client_;
  std::thread thread_;
  std::atomic<bool> fired_{false};
};

}  // namespace

void BlockInterruptSignals() { pthread_sigmask(SIG_BLOCK, &InterruptSet(), nullptr); }

int Follow(JobClient& client, const std::string& id, FollowOutput output) {
  InterruptWatcher interrupt(&client);
  ftd::v1::JobState final_state = ftd::v1::JOB_STATE_UNSPECIFIED;
  bool reconnecting = false;
  const bool live = isatty(STDOUT_FILENO) != 0;  // not a terminal (a file, a pipe): one line per event
  bool live_line = false;
  auto st = client.Watch(
      id, 0,
      [&](const ftd::v1::JobEvent& e) {
        if (e.has_state()) final_state = e.state().state();
        if (reconnecting) {
          std::cerr << "ftctl: reconnected" << std::endl;
          reconnecting = false;
        }
        if (output == FollowOutput::kNone) return;
        if (output == FollowOutput::kJson) {
          std::cout << ToJson(e, false) << std::endl;
        } else if (live && e.has_step()) {
          // On a terminal the step line is one live line, rewritten in place.
          std::cout << "\r\x1b[K" << EventLine(e) << std::flush;
          live_line = true;
        } else {
          if (live_line) std::cout << "\n";
          live_line = false;
          std::cout << EventLine(e) << std::endl;
        }
      },
      [&](const std::string& why) {
        if (!reconnecting) std::cerr << "ftctl: lost the connection to ftd (" << why << "); reconnecting" << std::endl;
        reconnecting = true;
      });
  if (live_line) std::cout << std::endl;
  if (interrupt.fired()) {
    std::cerr << "ftctl: stopped watching " << id << "; the job goes on" << std::endl;
    return kExitInterrupted;
  }
  if (!st.ok()) return Fail(st);
  if (final_state == ftd::v1::JOB_STATE_UNSPECIFIED) {
    auto job = client.Get(id);
    if (!job.ok()) return Fail(job.status());
    final_state = job->state();
  }
  return ExitCodeForState(final_state);
}

void PrintOutcome(JobClient& client, const std::string& id, int rc, std::ostream& out) {
  if (rc > kExitJobCancelled) return;
  auto job = client.Get(id);
  if (job.ok()) out << job->id() << " " << ftd::v1::JobState_Name(job->state()) << ": " << job->message() << std::endl;
}

}  // namespace ftd::client
