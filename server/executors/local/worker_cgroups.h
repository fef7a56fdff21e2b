// A memory-limited cgroup per worker, so that a job that outgrows its memory is killed alone, and
// told apart from other deaths: the kernel counts OOM kills per cgroup. cgroup v2 (memory.max,
// memory.events' oom_kill, memory.peak), or v1's memory controller on hosts that still mount it
// (memory.limit_in_bytes, memory.oom_control's oom_kill, memory.max_usage_in_bytes).
// Behind an interface so that tests inject what the kernel would report. Without cgroups
// (docs/api.md), the launcher falls back on the exit status and /proc/vmstat's oom_kill count.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ftd::server {

struct CgroupMemory {
  int64_t oom_kills = 0;    // processes the kernel's OOM killer killed in the cgroup
  int64_t peak_bytes = 0;   // its high-water mark (0: not reported by this kernel)
  int64_t limit_bytes = 0;  // its limit
};

class WorkerCgroups {
 public:
  virtual ~WorkerCgroups() = default;
  // Creates the cgroup `name` with the memory limit and moves `pid` into it.
  virtual absl::Status Place(const std::string& name, pid_t pid) = 0;
  // What the kernel recorded for `name` once its processes are gone; removes the cgroup.
  virtual CgroupMemory Release(const std::string& name) = 0;
  // The limit each worker gets (bytes).
  virtual int64_t limit_bytes() const = 0;
  // "cgroup v2 under /sys/fs/cgroup/ftd, memory.max 8.0 GiB per worker", for the daemon's log.
  virtual std::string Describe() const = 0;
};

// Worker cgroups under `parent` (a directory in a cgroup v2 or v1 memory hierarchy, created if
// missing), or, for "auto", under the daemon's own cgroup where that can hold children with a
// memory limit. An error says why not (the daemon then runs workers without).
absl::StatusOr<std::unique_ptr<WorkerCgroups>> OpenWorkerCgroups(const std::string& parent, int64_t limit_bytes);

// The system-wide count of OOM kills (/proc/vmstat oom_kill); -1 if unknown.
int64_t SystemOomKills();

}  // namespace ftd::server
