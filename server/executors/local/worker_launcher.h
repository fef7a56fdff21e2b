// This host's executor (executors/executor.h): ProcessLauncher runs `ftd-worker agent` for each
// attempt's ranks through the Supervisor, and says how they ended.
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
#include "server/common/local_users.h"
#include "server/executors/executor.h"
#include "server/executors/exit_status.h"
#include "server/executors/local/worker_cgroups.h"

namespace ftd::server {

class Supervisor;

// The environment variable that carries the attempt's token to the worker (never its command line).
inline constexpr char kAttemptTokenEnv[] = "FTD_ATTEMPT_TOKEN";

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
class ProcessLauncher final : public Executor {
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
