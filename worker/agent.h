// The worker's side of the daemon protocol (proto/ftd/v1/worker.proto): fetch the assignment over
// the daemon's unix socket, run the engine, stream started/steps/logs/heartbeats and the result.
// No LibTorch headers here: the engine is reached through engine.h.
#pragma once

#include <atomic>
#include <string>

#include "worker/engine/engine.h"

namespace ftd::worker {

struct AgentOptions {
  std::string address;  // "unix:/path/worker.sock"
  std::string job_id;
  int attempt = 0;
  std::string token;
  double heartbeat_s = 1.0;
  engine::RankInfo rank;  // a data-parallel job's: rank 0 streams to the daemon, the others only train
};

// Returns the process exit code (the same as `ftd-worker run`). `stop` is set by SIGTERM/SIGINT; the
// agent also sets it when the daemon goes away, so a worker never trains on unsupervised.
// `skip_checkpoint` is set (before `stop`) by SIGUSR1: stop without the checkpoint a stop writes.
int RunAgent(const AgentOptions& opts, std::atomic<bool>* stop, const std::atomic<bool>* skip_checkpoint);

}  // namespace ftd::worker
