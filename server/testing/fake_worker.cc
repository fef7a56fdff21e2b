// ftd-fake-worker: a stand-in for `ftd-worker agent`, built only for tests and benchmarks. ftd runs
// it through --worker like the real one; it speaks the real worker protocol (proto/ftd/v1/worker.proto)
// and acts out a script chosen by the job's name, so that tests can produce outcomes a CPU machine
// cannot (a GPU out-of-memory) and benchmarks can time the daemon without training anything.
//
//   FTD_FAKE_WORKER_SCRIPT  JSON object: job name (or "*" for any other) -> script:
//     {"steps": 3,                 step reports to send (step 1..N, 128 tokens each)
//      "step_interval_ms": 10,     pause before each step report
//      "allocate_mb": 512,         then allocate and touch this much memory, 1 MiB at a time
//      "wait_for_stop": true,      then keep heartbeating until SIGTERM or SIGUSR1; report CANCELLED
//                                  and exit 5. SIGTERM asks for a checkpoint first: it prints
//                                  "fake-worker: checkpoint" and takes "checkpoint_ms" (default 0) to
//                                  write it, reporting save_checkpoint progress every 100 ms; SIGUSR1
//                                  stops without one ("fake-worker: no checkpoint").
//      "result": "OUT_OF_MEMORY",  a RunResult outcome to report (absent: report nothing)
//      "message": "...",           its message
//      "exit": 3,                  the exit code (default 0)
//      "signal": 9,                or die of this signal instead of exiting
//      "heartbeat": false,         send no heartbeats (default true): ftd's --heartbeat-timeout-s fires
//      "ignore_stop": true}        ignore SIGTERM and SIGUSR1 (with wait_for_stop: run until SIGKILL)
//   FTD_FAKE_WORKER_REAL    the real ftd-worker: jobs without a script are handed to it (exec)
//
// It prints "fake-worker: started unix_us=<t>" first thing and "fake-worker: step <n> sent
// unix_us=<t>" right before each step report (to the job's worker.log), for latency measurements.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "proto/worker_link.h"
#include "nlohmann/json.hpp"

namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_checkpoint{false};  // the stop asked for a checkpoint (SIGTERM, not SIGUSR1)
extern "C" void OnSigterm(int sig) {
  if (sig != SIGUSR1) g_checkpoint.store(true);
  g_stop.store(true);
}

int64_t UnixUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int Fail(const std::string& what) {
  std::cerr << "fake-worker: " << what << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("fake-worker: started unix_us=%lld\n", static_cast<long long>(UnixUs()));
  std::fflush(stdout);
  struct sigaction sa = {};
  sa.sa_handler = OnSigterm;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);

  std::string address, job_id, token;
  int attempt = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--address") address = v;
    if (k == "--job") job_id = v;
    if (k == "--attempt") attempt = std::atoi(v.c_str());
  }
  if (const char* t = std::getenv("FTD_ATTEMPT_TOKEN"); t != nullptr) token = t;  // left for the real worker
  if (argc < 2 || std::string(argv[1]) != "agent" || address.empty() || job_id.empty()) {
    return Fail("usage: FTD_ATTEMPT_TOKEN=T ftd-fake-worker agent --address A --job J --attempt N");
  }
  auto link = ftd::WorkerLink::Connect(address, job_id, attempt, token);
  if (!link.ok()) return Fail(std::string(link.status().message()));
  const ftd::v1::Assignment& assignment = (*link)->assignment();

  nlohmann::json scripts = nlohmann::json::object();
  if (const char* env = std::getenv("FTD_FAKE_WORKER_SCRIPT"); env != nullptr) {
    scripts = nlohmann::json::parse(env, nullptr, /*allow_exceptions=*/false);
    if (!scripts.is_object()) return Fail("FTD_FAKE_WORKER_SCRIPT is not a JSON object");
  }
  nlohmann::json script;
  if (scripts.contains(assignment.name())) {
    script = scripts[assignment.name()];
  } else if (scripts.contains("*")) {
    script = scripts["*"];
  } else if (const char* real = std::getenv("FTD_FAKE_WORKER_REAL"); real != nullptr) {
    argv[0] = const_cast<char*>(real);
    ::execv(real, argv);
    return Fail(std::string("cannot run FTD_FAKE_WORKER_REAL ") + real);
  } else {
    return Fail("no script for job \"" + assignment.name() + "\" and no FTD_FAKE_WORKER_REAL");
  }

  (*link)->Open();
  auto send = [l = link->get()](const ftd::v1::WorkerMessage& m) { return l->Send(m); };
  if (script.value("heartbeat", true)) {
    (*link)->StartHeartbeat(std::chrono::seconds(1), [] {
      ftd::v1::WorkerMessage m;
      m.set_heartbeat(true);
      return m;
    });
  }
  if (script.value("ignore_stop", false)) {
    signal(SIGTERM, SIG_IGN);
    signal(SIGUSR1, SIG_IGN);
  }

  const int steps = script.value("steps", 0);
  const int interval_ms = script.value("step_interval_ms", 0);
  for (int s = 1; s <= steps && !g_stop.load(); ++s) {
    if (interval_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
    ftd::v1::WorkerMessage m;
    m.mutable_step()->set_step(s);
    m.mutable_step()->set_total_steps(steps);
    m.mutable_step()->set_tokens(128);
    m.mutable_step()->set_tokens_total(128LL * s);
    std::printf("fake-worker: step %d sent unix_us=%lld\n", s, static_cast<long long>(UnixUs()));
    std::fflush(stdout);
    send(m);
  }
  std::vector<std::unique_ptr<char[]>> held;
  for (int mb = 0; mb < script.value("allocate_mb", 0); ++mb) {
    held.emplace_back(new char[1 << 20]);
    std::memset(held.back().get(), mb + 1, 1 << 20);
  }
  std::string outcome = script.value("result", "");
  std::string message = script.value("message", "");
  int exit_code = script.value("exit", 0);
  if (script.value("wait_for_stop", false)) {
    while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (g_checkpoint.load()) {
      std::printf("fake-worker: checkpoint\n");
      std::fflush(stdout);
      const int checkpoint_ms = script.value("checkpoint_ms", 0);
      constexpr int64_t kTotal = 1000;
      for (int t = 0; t <= checkpoint_ms; t += 100) {
        ftd::v1::WorkerMessage m;
        m.mutable_progress()->set_phase("save_checkpoint");
        m.mutable_progress()->set_total_bytes(kTotal);
        m.mutable_progress()->set_done_bytes(checkpoint_ms == 0 ? kTotal : kTotal * t / checkpoint_ms);
        send(m);
        if (t < checkpoint_ms) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    } else {
      std::printf("fake-worker: no checkpoint\n");
      std::fflush(stdout);
    }
    outcome = "CANCELLED";
    message = "stopped on request";
    exit_code = 5;
  }
  if (!outcome.empty()) {
    ftd::v1::RunResult::Outcome o;
    if (!ftd::v1::RunResult::Outcome_Parse(outcome, &o)) return Fail("unknown result \"" + outcome + "\"");
    ftd::v1::WorkerMessage m;
    m.mutable_result()->set_outcome(o);
    m.mutable_result()->set_message(message);
    send(m);
  }
  (*link)->Close();
  std::fflush(stdout);
  if (script.contains("signal")) {
    const int sig = script["signal"].get<int>();
    signal(sig, SIG_DFL);
    ::raise(sig);
  }
  return exit_code;
}
