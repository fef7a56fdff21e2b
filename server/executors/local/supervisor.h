// Worker processes: started with fork and exec in a process group of their own, with stdout/stderr
// going to a log file and no inherited descriptors (everything the daemon opens is close-on-exec);
// when asked, the child gives up root (setgroups, setgid, setuid) before it execs.
// One reaper thread waits on a pidfd per child it started (never waitpid(-1): other children of the
// daemon are not its business), kills what a worker left in its group, reaps it and reports the
// exit; the same thread sends the SIGKILLs that follow a Stop's grace period. Needs Linux >= 5.3.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/executors/exit_status.h"

namespace ftd::server {

// Who a child runs as: set in the child between fork and exec (the daemon must be root to switch).
struct SpawnCredentials {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups; empty: none
};

struct SpawnRequest {
  std::string binary;
  std::vector<std::string> args;                         // argv[1..]
  std::vector<std::pair<std::string, std::string>> env;  // added to / overriding the daemon's
  std::string log_path;                                  // stdout and stderr, appended (never through a symlink)
  pid_t process_group = 0;  // join this child's group (a rank of the same job); 0: a group of its own
  std::optional<SpawnCredentials> credentials;           // unset: the daemon's own
};

class Supervisor {
 public:
  using ExitCallback = std::function<void(pid_t, ExitStatus)>;
  explicit Supervisor(ExitCallback on_exit);
  ~Supervisor();  // stops the reaper; does not kill workers

  // RESOURCE_EXHAUSTED when the daemon itself is short of what starting a process takes (EMFILE,
  // ENFILE, ENOMEM, EAGAIN: a pipe, a pidfd, the fork, the child's log descriptor); INTERNAL for
  // any other failure (no such binary, no such user).
  absl::StatusOr<pid_t> Spawn(const SpawnRequest& req);
  // `sig` (SIGTERM, SIGUSR1) to the process group now, SIGKILL to it after `grace_ms` if it is still
  // there (replacing an earlier deadline). Only for a child of this supervisor that has not been
  // reaped (so its group id cannot have been reused).
  void Stop(pid_t pid, int grace_ms, int sig);
  // A child being stopped gets its SIGKILL no sooner than `grace_ms` from now.
  void Postpone(pid_t pid, int grace_ms);
  // SIGKILL to the process group of a child not yet reaped (a group leader).
  void Kill(pid_t pid);

 private:
  void Reap();
  void Wake();
  ExitCallback on_exit_;
  std::mutex mu_;
  std::map<pid_t, int> live_;              // pid -> pidfd
  std::multimap<int64_t, pid_t> kill_at_;  // steady ms -> pid
  bool stopping_ = false;
  int wake_fd_ = -1;                       // eventfd: the set of children or deadlines changed
  std::thread reaper_;
};

}  // namespace ftd::server
