// Starting and stopping worker processes, behind an interface: the job manager asks for an attempt to
// be launched and is told when its worker is gone. ProcessLauncher runs `ftd-worker agent` through
// the Supervisor; tests inject a launcher that starts nothing.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/executors/exit_status.h"
#include "server/executors/local/worker_cgroups.h"

namespace ftd::server {

class Supervisor;

// The environment variable that carries the attempt's token to the worker (never its command line).
inline constexpr char kAttemptTokenEnv[] = "FTD_ATTEMPT_TOKEN";

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

class WorkerLauncher {
 public:
  // Called once per launched attempt when its worker has ended (from a thread of the launcher's).
  using ExitHandler = std::function<void(const std::string& job_id, int attempt, ExitStatus)>;
  virtual ~WorkerLauncher() = default;

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

// The unprivileged user workers run as (ftd --worker-user), as the password database has it.
struct WorkerUser {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // its supplementary groups (its primary one included)
  std::string home;
};

// `name`'s entry. A daemon that is not root cannot switch users: refused, saying so.
absl::StatusOr<WorkerUser> LookUpWorkerUser(const std::string& name);
// The entry of a job owner's uid (--workers-as-owner): FAILED_PRECONDITION for root or a uid the
// password database does not know.
absl::StatusOr<WorkerUser> LookUpOwner(uid_t uid);

struct ProcessLauncherConfig {
  std::string worker_binary;   // ftd-worker (or a test double speaking its protocol)
  std::string worker_address;  // "unix:<data_dir>/worker.sock"
  std::string jobs_dir;        // <data_dir>/jobs: <job>/worker.log
  WorkerCgroups* cgroups = nullptr;  // a memory-limited cgroup per worker; nullptr: none (outlives the launcher)
  std::optional<WorkerUser> user;    // unset: workers run as the daemon's user
  // Jobs with an owner_uid run as that user (its primary group and supplementary groups), the others
  // as `user`, which must then be set.
  bool as_owner = false;
};

// `<worker_binary> agent --address A --job J --attempt N` with the token in $FTD_ATTEMPT_TOKEN, in a
// process group of its own, CUDA_VISIBLE_DEVICES set to its GPU, output appended to jobs/<id>/worker.log, in a cgroup of its
// own when `cgroups` is set. The exit it reports says whether the kernel's OOM killer ended it.
// A data-parallel attempt (ranks > 1) is one such process per rank, with `--rank r --store
// jobs/<id>/rendezvous-<attempt>.store`, every GPU of the job visible to each, all in rank 0's
// process group (so Stop and Kill reach every rank): a rank that fails kills the group, and the
// attempt's exit is reported once every rank is gone, as the first failed rank's (else rank 0's).
// Every process gets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1.
// With `user`, the job's directory (and all in it) is given to that user before the worker starts,
// and the worker runs as it, with its HOME; with `as_owner`, a job with an owner_uid gets its
// owner instead.
class ProcessLauncher final : public WorkerLauncher {
 public:
  explicit ProcessLauncher(ProcessLauncherConfig cfg);
  ~ProcessLauncher() override;

  void SetExitHandler(ExitHandler handler) override;
  absl::StatusOr<int64_t> Launch(const LaunchRequest& req) override;
  void Stop(int64_t pid, std::chrono::milliseconds grace, StopMode mode) override;
  void Postpone(int64_t pid, std::chrono::milliseconds grace) override;
  void Kill(int64_t pid) override;
  void KillOrphan(int64_t pid, const std::string& job_id) override;

 private:
  struct Running {
    std::string job_id;
    int attempt = 0;
    std::string cgroup;          // its cgroup's name; empty: none
    int64_t oom_kills = -1;      // /proc/vmstat's oom_kill count at its start (without a cgroup)
    int live_ranks = 1;          // processes of the attempt not yet reaped
    bool leader_gone = false;    // rank 0 was reaped (its group was killed then)
    ExitStatus leader_status;
    std::optional<ExitStatus> first_failure;  // of a rank > 0 that failed while rank 0 ran
  };
  void OnExit(pid_t pid, ExitStatus st);
  void MarkKilled(int64_t pid);
  ProcessLauncherConfig cfg_;
  ExitHandler handler_;
  std::mutex mu_;
  std::map<pid_t, Running> attempts_;  // by rank 0's pid
  std::map<pid_t, pid_t> followers_;    // a rank > 0's pid -> its rank 0's pid
  // Workers ftd sent SIGKILL (or a Stop, which may end in one). A lock of its own: Stop and Kill are
  // called under the job manager's lock, which the exit handler takes under mu_.
  std::mutex killed_mu_;
  std::set<pid_t> killed_;
  std::unique_ptr<Supervisor> supervisor_;
};

}  // namespace ftd::server
