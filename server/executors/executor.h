// Where a job's attempts run, behind one interface: the job manager asks an executor to start an
// attempt (with its ranks), to stop it (with or without a checkpoint) or kill it, and is told how it
// ended. executors/local/ is this host's (ProcessLauncher: worker processes started, confined and
// reaped here); the job manager's tests drive a fake one that starts nothing. Placement on this
// host's GPUs (slots, --jobs-per-gpu, predicted memory per GPU) is still the job manager's
// (docs/architecture.md).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/executors/exit_status.h"

namespace ftd::server {

struct LaunchRequest {
  std::string job_id;
  int attempt = 0;
  std::string token;  // the attempt's secret, checked on every worker message
  std::string slot;   // "gpu:N", "gpu:N/k" (one of several jobs on GPU N) or "cpu"
  int gpu = -1;       // the CUDA device it runs on (CUDA_VISIBLE_DEVICES); -1: none
  std::vector<std::string> more_slots;  // gpus > 1: the job's other GPUs' slots
  std::vector<int> more_gpus;           // and their CUDA devices, in the same order
  int ranks = 1;      // worker processes (spec.gpus), rank 0 first; one process group, one exit
  std::optional<uid_t> owner_uid = std::nullopt;  // Job.owner_uid: the local owner's uid, when known
};

// How a worker is asked to stop: SIGTERM, write a checkpoint and stop (drain, cancel --checkpoint);
// SIGUSR1, stop at the next step boundary without one (a plain cancel).
enum class StopMode { kCheckpoint, kNoCheckpoint };

class Executor {
 public:
  // Called once per launched attempt when its worker has ended (from a thread of the launcher's).
  using ExitHandler = std::function<void(const std::string& job_id, int attempt, ExitStatus)>;
  virtual ~Executor() = default;

  // Set before the first Launch; nullptr detaches (returning once no call is in flight).
  virtual void SetExitHandler(ExitHandler handler) = 0;
  // Starts the attempt's worker; returns its process id (also its process group's).
  virtual absl::StatusOr<int64_t> Launch(const LaunchRequest& req) = 0;
  // Asks the worker to stop (a signal to its group, as `mode` says), killing it after `grace`.
  virtual void Stop(int64_t pid, std::chrono::milliseconds grace, StopMode mode) = 0;
  // A stopping worker showed progress: its kill comes no sooner than `grace` from now.
  virtual void Postpone(int64_t pid, std::chrono::milliseconds grace) = 0;
  // Kills the worker's process group now.
  virtual void Kill(int64_t pid) = 0;
  // A worker a previous daemon started for `job_id` (its pid from the store) may still run: kill its
  // group if that process is such a worker.
  virtual void KillOrphan(int64_t pid, const std::string& job_id) = 0;
};

}  // namespace ftd::server
