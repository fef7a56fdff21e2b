// The process_* series that Prometheus client libraries export by default (prometheus-cpp has none),
// read from /proc at each scrape, and ftd_build_info{version, commit}.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ftd::server {

struct ProcessStats {
  double cpu_seconds = 0;         // user + system
  double start_time_seconds = 0;  // since the Unix epoch
  int64_t resident_bytes = 0;
  int64_t virtual_bytes = 0;
  int64_t open_fds = 0;
  int64_t max_fds = -1;           // the soft limit; -1: unlimited or unknown
};

// The calling process's numbers from `proc` (normally "/proc": its stat, self/stat, self/fd and
// self/limits).
absl::StatusOr<ProcessStats> ReadProcessStats(const std::string& proc = "/proc");

class ProcessCollector : public prometheus::Collectable {
 public:
  ProcessCollector(std::string version, std::string commit, std::string proc = "/proc");
  // process_cpu_seconds_total, process_start_time_seconds, process_resident_memory_bytes,
  // process_virtual_memory_bytes, process_open_fds, process_max_fds, ftd_build_info (1). The
  // process_* families are left out when /proc cannot be read.
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::string version_, commit_, proc_;
};

}  // namespace ftd::server
