// How a worker process ended, as the kernel reported it when it was reaped.
#pragma once

#include <cstdint>
#include <string>

namespace ftd::server {

struct ExitStatus {
  bool signaled = false;
  int code = 0;    // exit code when !signaled
  int signal = 0;  // terminating signal when signaled
  // The kernel's OOM killer ended it: counted in the worker's cgroup, or, without one, a SIGKILL ftd
  // did not send while /proc/vmstat's oom_kill count rose (worker_cgroups.h).
  bool oom_killed = false;
  int64_t memory_limit_bytes = 0;  // the worker's cgroup limit (0: no cgroup)
  int64_t memory_peak_bytes = 0;   // its cgroup's high-water mark (0: unknown)
};

// "exit code 3", "killed by signal 9 (SIGKILL)".
std::string Describe(const ExitStatus& st);

}  // namespace ftd::server
