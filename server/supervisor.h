// Worker processes: one per job attempt, started with posix_spawn in a process group of its own,
// with stdout/stderr going to the job's log file and no inherited descriptors (everything the
// daemon opens is close-on-exec). A reaper thread waits for them and reports each exit.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace ftd::server {

struct SpawnRequest {
  std::string binary;
  std::vector<std::string> args;                  // argv[1..]
  std::vector<std::pair<std::string, std::string>> env;  // added to / overriding the daemon's
  std::string log_path;                           // stdout and stderr, appended
};

// How a process ended, as waitpid said.
struct ExitStatus {
  bool signaled = false;
  int code = 0;    // exit code when !signaled
  int signal = 0;  // terminating signal when signaled
};

class Supervisor {
 public:
  using ExitCallback = std::function<void(pid_t, ExitStatus)>;
  explicit Supervisor(ExitCallback on_exit);
  ~Supervisor();  // stops the reaper; does not kill workers

  absl::StatusOr<pid_t> Spawn(const SpawnRequest& req);
  // SIGTERM to the process group now, SIGKILL to it after `grace_ms` if it is still there.
  void Stop(pid_t pid, int grace_ms);
  // SIGKILL to the process group.
  static void Kill(pid_t pid);
  size_t running() const;

 private:
  void Reap();
  ExitCallback on_exit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<pid_t, bool> live_;
  bool stopping_ = false;
  std::thread reaper_;
  std::thread killer_;
  std::multimap<int64_t, pid_t> kill_at_;  // steady ms -> pid
};

}  // namespace ftd::server
